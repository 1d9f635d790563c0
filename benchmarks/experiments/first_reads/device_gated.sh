# Experiment 115 on the GPU machine, carrying .whl and .abcache (on the CPU host, with the gate in the
# working tree: `source benchmarks/experiments/hazards/ab_trees.sh; make_trees dg`): the later
# tokens' list units dealt to the warps only where the busiest warp has more than 1.5 times the mean
# entries, and only in the rounds (512 threads). The pre-pass alone (lists compared bitwise), whole
# calls, then the token groups' GPU tests.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base dg
# At 1024 rows groups of 8 at 8K are one wave (CTAs of 1024 threads, main's code), as are groups of
# 8 at 128K at any s_q: only the rounds' cases are timed.
H16=realistic-glm:8192:16,realistic-glm:131072:16,realistic-dsv4:8192:16,realistic-dsv4:131072:16,uniform:8192:16
S_Q=1024 CASES=$H16 timeout 100 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base \
  dg=/tmp/j_dg base2=/tmp/j_base 2>&1 | grep -v Warn | sed "s/^/s_q 1024: /"
S_Q=4096 CASES=$H16,realistic-glm:8192:8,realistic-dsv4:8192:8,uniform:8192:8 timeout 170 python3 \
  benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base dg=/tmp/j_dg base2=/tmp/j_base 2>&1 |
  grep -v Warn | sed "s/^/s_q 4096: /"
AB="$(ab_command dg)"
$AB --indices realistic-glm --shape 1024,8192,16,576,2048 --shape 1024,131072,16,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_dg_glm.json 2>&1 | grep -v Warn | tail -5
$AB --indices realistic-dsv4 --shape 4096,8192,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_dg_dsv4.json 2>&1 | grep -v Warn | tail -3
$AB --indices uniform --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --json $OUT/ab_dg_uniform.json 2>&1 | grep -v Warn | tail -3
in_tree dg python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 4096 -j 16 | tail -n 1
in_tree dg timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_groups.py 2>&1 | tail -n 3

# Experiment 110 on the GPU machine, carrying .whl and .abcache: the rounds' list pass loading token
# t's slots that make an entry together (la), and a token ahead (lb). The pre-pass alone (lists
# compared bitwise), then whole calls, then the token groups' GPU tests on la. Run at 7af2670, before
# la landed; to re-run lb against main, `make_trees lb` (ab_trees.sh) with later_loads_ahead.patch
# applied and drop la from the lines below.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base la lb
for s in 1024 4096; do
  S_Q=$s CASES=realistic-glm:8192:16,realistic-glm:131072:16,realistic-glm:8192:8,realistic-dsv4:131072:16 \
    timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base la=/tmp/j_la lb=/tmp/j_lb \
    base2=/tmp/j_base 2>&1 | grep -v Warn | sed "s/^/s_q $s: /"
done
AB="$(ab_command la lb)"
$AB --indices realistic-glm --shape 1024,8192,16,576,2048 --shape 1024,131072,16,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_la_glm.json 2>&1 | grep -v Warn | tail -7
$AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 --json $OUT/ab_la_dsv4.json 2>&1 | grep -v Warn | tail -4
# The first change at every key the tests use, then the token groups' GPU tests on it.
in_tree la python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 | tail -n 1
in_tree la python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -n 1
in_tree la timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_groups.py 2>&1 | tail -n 3

# Experiment 114 on the GPU machine, carrying .whl and .abcache (on the CPU host: apply
# dealt_units.patch, `source benchmarks/experiments/hazards/ab_trees.sh; make_trees dl`, restore): the
# later tokens' list units dealt to the warps in turn. The pre-pass alone (lists compared bitwise),
# whole calls, the token groups' GPU tests, then tests/gpu for as long as the device time lasts.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base dl
for s in 1024 4096; do
  S_Q=$s CASES=realistic-glm:8192:16,realistic-glm:131072:16,realistic-glm:8192:8,realistic-glm:131072:8,realistic-dsv4:131072:16,realistic-dsv4:131072:8,uniform:8192:8 \
    timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base dl=/tmp/j_dl \
    base2=/tmp/j_base 2>&1 | grep -v Warn | sed "s/^/s_q $s: /"
done
AB="$(ab_command dl)"
$AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,8192,16,576,2048 --shape 1024,131072,16,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_dl_glm.json 2>&1 | grep -v Warn | tail -6
$AB --indices realistic-dsv4 --shape 1024,131072,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_dl_dsv4.json 2>&1 | grep -v Warn | tail -3
in_tree dl python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 | tail -n 1
in_tree dl python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -n 1
in_tree dl timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_groups.py 2>&1 | tail -n 3
in_tree dl timeout 400 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu > $OUT/tests_gpu_dl.txt 2>&1; tail -n 4 $OUT/tests_gpu_dl.txt

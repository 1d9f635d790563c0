# balanced_when_idle.patch against its baseline, side by side, on the GPU machine (from the repository root,
# after prepare.sh here; carry .abcache): each build through its own tree's launch plan (ab.py's @PLAN),
# the patched tree's kernel-by-kernel breakdown (the straddling call included), then its tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees bal
AB="python3 benchmarks/experiments/hazards/ab.py --iters 25 --variant base=/tmp/j_base@.abcache/base/python/sparse_mla/launch.py --variant bal=/tmp/j_bal@.abcache/bal/python/sparse_mla/launch.py"
$AB --indices realistic-glm --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 1024,8192,16,576,2048 --shape 256,8192,16,576,2048 --shape 64,8192,8,576,2048 \
  --json $OUT/ab_bal_glm.json 2>&1 | tail -9
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --shape 512,32768,32,576,2048 \
  --json $OUT/ab_bal_dsv4.json 2>&1 | tail -5
$AB --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,64,576,2048 --json $OUT/ab_bal_uniform.json 2>&1 | tail -5
(in_tree bal python3 $AB_ROOT/benchmarks/experiments/token_groups/breakdown.py --json $OUT/breakdown_bal.json 2>&1 | grep -v Warn | tail -8)
(in_tree bal timeout 420 python3 -m pytest tests/gpu -q -rs -x -p no:cacheprovider > $OUT/tests_bal.txt 2>&1; tail -6 $OUT/tests_bal.txt)

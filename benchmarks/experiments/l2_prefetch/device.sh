# Experiment 68 on the GPU machine, from the repository root, carrying .abcache, after
# `make_trees pf2 pf1` (hazards/ab_trees.sh) here, with l2_prefetch.patch applied and PREFETCH_PAIRS
# then set to 1 in .abcache/pf1, HEAD the commit before the change: the L2 prefetch of the rows 2 (pf2) or 1 (pf1) pairs
# ahead, side by side with the baseline (twice: the noise floor), at s_kv 128K where kv does not fit
# L2 and at 8-32K where it does; then the baseline's kernel timeline of token-grouped calls.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base pf2 pf1
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 15 --variant base=/tmp/j_base --variant pf2=/tmp/j_pf2 --variant pf1=/tmp/j_pf1 --variant base2=/tmp/j_base"
K=131072
$AB --indices uniform --shape 4096,$K,64,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,8,576,2048 \
  --shape 4096,$K,128,576,2048 --shape 1024,65536,128,576,2048 --shape 4096,32768,128,576,2048 \
  --shape 4096,8192,128,576,2048 --json $OUT/ab_uniform.json > $OUT/ab_uniform.txt 2>&1; tail -n 9 $OUT/ab_uniform.txt
$AB --indices realistic-glm --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,32,576,2048 \
  --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_glm.json > $OUT/ab_glm.txt 2>&1; tail -n 7 $OUT/ab_glm.txt
$AB --indices realistic-dsv4 --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,64,576,2048 \
  --json $OUT/ab_dsv4.json > $OUT/ab_dsv4.txt 2>&1; tail -n 5 $OUT/ab_dsv4.txt
PYTHONPATH=$PWD/.abcache/base/python:/tmp/site SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_base timeout 120 \
  python3 benchmarks/experiments/token_groups/timeline.py --json $OUT/timeline.json > $OUT/timeline.txt 2>&1; cat $OUT/timeline.txt | grep -v Warn

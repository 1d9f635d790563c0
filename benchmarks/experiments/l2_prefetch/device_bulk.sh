# Experiment 68b on the GPU machine, from the repository root, carrying .abcache, after
# `make_trees bulk2 bulk3` (hazards/ab_trees.sh) here with l2_prefetch_bulk.patch applied, then
# PREFETCH_PAIRS set to 3 in .abcache/bulk3:
# the rows ahead asked of L2 by the TMA unit (one bulk prefetch a row), side by side with the baseline.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base bulk2 bulk3
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 15 --variant base=/tmp/j_base --variant bulk2=/tmp/j_bulk2 --variant bulk3=/tmp/j_bulk3 --variant base2=/tmp/j_base"
K=131072
$AB --indices uniform --shape 4096,$K,64,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,128,576,2048 \
  --shape 4096,8192,128,576,2048 --json $OUT/ab_bulk_uniform.json > $OUT/ab_bulk_uniform.txt 2>&1; tail -n 6 $OUT/ab_bulk_uniform.txt
$AB --indices realistic-glm --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,8192,32,576,2048 \
  --json $OUT/ab_bulk_glm.json > $OUT/ab_bulk_glm.txt 2>&1; tail -n 5 $OUT/ab_bulk_glm.txt
$AB --indices realistic-dsv4 --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 \
  --json $OUT/ab_bulk_dsv4.json > $OUT/ab_bulk_dsv4.txt 2>&1; tail -n 4 $OUT/ab_bulk_dsv4.txt

# Experiment 85 on the GPU machine (`bash benchmarks/experiments/row_address/device.sh`, from the
# repository root, carrying .whl and .abcache). Before the call, here, with row_address.patch applied:
# `make_trees w32m` (hazards/ab_trees.sh; .abcache/base is HEAD, the commit before the change), then
# .abcache/w32 a copy of w32m with the grouped mask copy as before (the row address alone). Whole
# calls side by side with the base (twice), every tile.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base w32 w32m
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant w32=/tmp/j_w32 --variant w32m=/tmp/j_w32m --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,32,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/row-address-ab-glm.json 2>&1 | tail -n 6
$AB --indices uniform --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 --shape 4096,131072,128,576,2048 \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --shape 437,8192,64,576,2048 \
  --json $OUT/row-address-ab-uniform.json 2>&1 | tail -n 8

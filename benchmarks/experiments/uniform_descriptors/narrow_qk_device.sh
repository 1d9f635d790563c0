# Experiment 122: the narrow tiles' Q.K^T descriptors from lane 0 (narrow_qk_only.patch, the tree made by
# `make_trees s122` with the patch applied) against their parent twice, token groups off, uniform.
# From the repository root on the GPU machine, carrying .whl and .abcache.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base s122
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices uniform --variant base=/tmp/j_base:never --variant s122=/tmp/j_s122:never --variant base2=/tmp/j_base:never"
timeout 200 $AB --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 1024,8192,16,576,2048 --json $OUT/s122-uniform.json 2>&1 | tail -n 7

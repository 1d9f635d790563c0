# The grouped launch's tail split against main, on the GPU machine, from the repository root (see
# README.md beside this), carrying .whl and .abcache (`make_trees gsplit` from hazards/ab_trees.sh).
# Main's entries take other arguments: its variants run through its own launch plan.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base gsplit
BASE=/tmp/j_base@.abcache/base/python/sparse_mla/launch.py
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=$BASE --variant gsplit=/tmp/j_gsplit --variant base2=$BASE"
timeout 300 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 \
  --shape 300,8192,32,576,2048 --shape 8192,8192,32,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,8192,8,576,2048 --json $OUT/gsplit-glm.json 2>&1 | tail -n 11
timeout 100 $AB --indices realistic-dsv4 --shape 4096,8192,32,576,2048 --shape 300,8192,16,576,2048 \
  --json $OUT/gsplit-dsv4.json 2>&1 | tail -n 4

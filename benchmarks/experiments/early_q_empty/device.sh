# Experiment 99: the 64-row tiles' consumers release Q (q_empty) as soon as the unit's last Q.K^T is
# retired, half a pair earlier (early, the working tree), against the parent (base, HEAD), timed
# twice. From the repository root on the GPU machine, carrying .whl and .abcache (made here first:
# `source benchmarks/experiments/hazards/ab_trees.sh && make_trees early`).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base early
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant early=/tmp/j_early --variant base2=/tmp/j_base"
timeout 200 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,32,576,2048 --json $OUT/early-glm.json 2>&1 | tail -n 7
timeout 60 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --json $OUT/early-dsv4.json 2>&1 | tail -n 2
timeout 120 $AB --indices uniform --shape 4096,32768,64,576,2048 --shape 4096,32768,128,576,2048 \
  --shape 437,8192,64,576,2048 --json $OUT/early-uniform.json 2>&1 | tail -n 5

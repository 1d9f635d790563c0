# The wide tile's consumers take a unit's pairs from the producer through shared memory when the call
# has topk_length (wlen), against its parent (base), timed twice; the last shape has no topk_length
# (the plain path's runtime branch). From the repository root on the GPU machine, carrying .whl and
# .abcache (README.md beside this).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base wlen
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant wlen=/tmp/j_wlen --variant base2=/tmp/j_base"
timeout 150 $AB --topk-length random --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 \
  --shape 4096,32768,128,576,2048 --shape 437,8192,64,576,2048 --json $OUT/wlen-lengths.json 2>&1 | tail -n 6
timeout 60 $AB --shape 4096,32768,64,576,2048 --json $OUT/wlen-plain.json 2>&1 | tail -n 2

# Experiment 69 on the GPU machine, from the repository root, carrying .abcache, after
# `make_trees h0 h64 h128` (hazards/ab_trees.sh) here and, in those trees, the gather's cp.async L2
# hint (primitives.cuh cp_async_16) removed (h0) or set to 64 or 128 bytes:
# side by side with the baseline (L2::256B, twice: the noise floor), at s_kv 128K where kv does not
# fit L2 and at 8-32K where it does.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base h0 h64 h128
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 15 --variant base=/tmp/j_base --variant h0=/tmp/j_h0 --variant h64=/tmp/j_h64 --variant h128=/tmp/j_h128 --variant base2=/tmp/j_base"
K=131072
$AB --indices uniform --shape 4096,$K,64,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,8,576,2048 \
  --shape 4096,$K,128,576,2048 --shape 1024,65536,128,576,2048 --shape 4096,32768,128,576,2048 \
  --shape 4096,8192,128,576,2048 --shape 4096,8192,16,576,2048 --json $OUT/ab_uniform.json > $OUT/ab_uniform.txt 2>&1; tail -n 10 $OUT/ab_uniform.txt
$AB --indices realistic-glm --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,32,576,2048 \
  --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_glm.json > $OUT/ab_glm.txt 2>&1; tail -n 7 $OUT/ab_glm.txt
$AB --indices realistic-dsv4 --shape 4096,$K,8,576,2048 --shape 4096,$K,16,576,2048 --shape 4096,$K,64,576,2048 \
  --shape 4096,$K,32,576,2048 --json $OUT/ab_dsv4.json > $OUT/ab_dsv4.txt 2>&1; tail -n 6 $OUT/ab_dsv4.txt

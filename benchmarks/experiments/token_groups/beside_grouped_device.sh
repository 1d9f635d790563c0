# Experiment 79 on the GPU machine (`bash beside_grouped_device.sh`), from the repository root,
# carrying .abcache, after `make_trees pdl` (hazards/ab_trees.sh) here, HEAD the commit before the
# change and the working tree with it: whole calls of both side by side (all grouped, all one by one,
# mixed, and a wide-tile control), then the changed tree's tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees pdl
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant pdl=/tmp/j_pdl --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 1024,8192,16,576,2048 --shape 4096,8192,64,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 8
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -n 4
$AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,131072,8,576,2048 --json $OUT/ab_uniform.json 2>&1 | tail -n 4
(in_tree pdl timeout 300 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_pdl.txt 2>&1; tail -n 6 $OUT/tests_pdl.txt)

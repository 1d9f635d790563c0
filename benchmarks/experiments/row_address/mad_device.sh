# Experiment 86 on the GPU machine (`bash benchmarks/experiments/row_address/mad_device.sh`, from the
# repository root, carrying .whl and .abcache), after `make_trees mad` (hazards/ab_trees.sh) here with
# mad_wide.patch applied: the row address by mad.wide.s32, whole calls beside the base (twice).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base mad
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant mad=/tmp/j_mad --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,32,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/mad-ab-glm.json 2>&1 | tail -n 6
$AB --indices uniform --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 --shape 4096,131072,128,576,2048 \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --shape 437,8192,64,576,2048 \
  --json $OUT/mad-ab-uniform.json 2>&1 | tail -n 8

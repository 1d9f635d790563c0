# Experiment 88 on the GPU machine (`bash benchmarks/experiments/probs_fence/device.sh`, from the
# repository root, carrying .whl and .abcache): where the softmax's proxy fence for P goes, whole calls
# side by side with the base (twice). Before the call, here: `make_trees nf fw fwa`
# (hazards/ab_trees.sh), then each tree edited as README.md says (nf: the narrow tiles' fast-path fence
# removed, a bound only; fw: the narrow tiles' fence after the wgmma wait; fwa: fw and the same in the
# wide and grouped tiles).
source benchmarks/experiments/hazards/ab_trees.sh
VARIANTS=${VARIANTS:-nf fw fwa}
build_2048 base $VARIANTS
AB=$(ab_command $VARIANTS)
# Uniform: the narrow tiles (h_q 32, 16; h_q 8 at 128K, where no group of 8 pays), the wide tile (64, 128).
$AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 \
  --json $OUT/fence-ab-uniform.json 2>&1 | tail -n 8
# Realistic-glm: the grouped tile.
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --json $OUT/fence-ab-glm.json 2>&1 | tail -n 5

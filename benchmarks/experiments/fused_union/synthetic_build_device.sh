# Experiment 84 on the GPU machine (`bash benchmarks/experiments/fused_union/synthetic_build_device.sh`,
# from the repository root, carrying .whl and .abcache), after, here, with synthetic_build.patch applied:
#   source benchmarks/experiments/hazards/ab_trees.sh; make_trees NAME...
# and each tree's SYNTH_BUILD_SLOTS / SYNTH_BUILD_LATE (traits.cuh) set for its variant: the first run
# had s2 / s4 / s8 (slots 2 / 4 / 8, early), the second e4 (4, early), l2 / l4 (2 / 4, late).
# The grouped launch with a synthetic share of a union build in its producer, beside main: whole calls
# on realistic-glm at h_q 32 / 16 / 8 (every unit grouped) and the 64-head wide tile as a control.
source benchmarks/experiments/hazards/ab_trees.sh
VARIANTS=${VARIANTS:-s2 s4 s8}
build_2048 base $VARIANTS
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base"
for v in $VARIANTS; do AB="$AB --variant $v=/tmp/j_$v"; done
$AB --variant base2=/tmp/j_base --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,32768,32,576,2048 \
  --shape 1024,8192,32,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,8192,64,576,2048 \
  --json $OUT/synthetic-build-ab-glm-$(echo $VARIANTS | tr ' ' '-').json 2>&1 | tail -n 8

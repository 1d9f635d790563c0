# Experiment 87 on the GPU machine (`bash benchmarks/experiments/narrow_qk_chains/device.sh`, from the
# repository root, carrying .whl and .abcache): the narrow tiles' Q.K^T in QK_CHAINS accumulators,
# whole calls side by side with the base (twice). Before the call, here:
#   source benchmarks/experiments/hazards/ab_trees.sh && make_trees qk2   (the patch applied: 2 chains)
#   then .abcache/qk3 a copy of qk2 with QK_CHAINS = 3.
source benchmarks/experiments/hazards/ab_trees.sh
VARIANTS=${VARIANTS:-qk2 qk3}
build_2048 base $VARIANTS
AB=$(ab_command $VARIANTS)
# Uniform selections: no group pays, so every token runs a narrow tile (h_q 8, 16, 32: the 8-, 16- and
# 32-head tiles); h_q 64 is the control (wide tile, unchanged).
$AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 1024,8192,16,576,2048 --shape 4096,8192,64,576,2048 \
  --json $OUT/qk-chains-ab-uniform.json 2>&1 | tail -n 8
# Realistic selections: the grouped tile (unchanged) with the narrow launch for groups that do not pay.
$AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 4096,131072,8,576,2048 \
  --json $OUT/qk-chains-ab-dsv4.json 2>&1 | tail -n 4

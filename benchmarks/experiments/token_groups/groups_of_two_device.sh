# The groups-of-two pre-pass (prefill_kernel_token_groups_of_two) beside its base, on the GPU
# machine (`bash groups_of_two_device.sh`, from the repository root, carrying .whl and .abcache). The
# trees, made here with HEAD the base (../hazards/ab_trees.sh): `make_trees lean`, or other names
# given in VARIANTS (default: lean). The pre-pass of each with their lists compared (the base twice;
# groups of 4 and 8 as controls: their kernels did not change), then whole calls. Experiment 76 ran it
# with VARIANTS="lean lean4" (its trimmed form at three and at four CTAs an SM).
source benchmarks/experiments/hazards/ab_trees.sh
VARIANTS=${VARIANTS:-lean}
build_2048 base $VARIANTS
PREPASS="base=/tmp/j_base" AB="--variant base=/tmp/j_base"
for v in $VARIANTS; do PREPASS="$PREPASS $v=/tmp/j_$v"; AB="$AB --variant $v=/tmp/j_$v"; done
CASES=realistic-glm:8192:32,realistic-glm:32768:32,realistic-glm:131072:32,realistic-dsv4:8192:32,realistic-dsv4:131072:32,uniform:8192:32,uniform:131072:32,realistic-glm:8192:16,realistic-glm:131072:8 \
  timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py $PREPASS base2=/tmp/j_base 2>&1 \
  | tee $OUT/groups_of_two_prepass_ab.txt | grep -v Warn
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 $AB --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,8192,24,576,2048 \
  --shape 4096,8192,16,576,2048 --json $OUT/groups_of_two_ab_glm.json 2>&1 | tail -n 5
$AB --indices realistic-dsv4 --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 \
  --json $OUT/groups_of_two_ab_dsv4.json 2>&1 | tail -n 3
$AB --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --json $OUT/groups_of_two_ab_uniform.json 2>&1 | tail -n 3

# Experiments 85 and 86 on the GPU machine (`bash benchmarks/experiments/row_address/device.sh`, from
# the repository root, carrying .whl and .abcache): whole calls of each variant side by side with the
# base (twice), every tile; .abcache/base is HEAD, the commit before the change (hazards/ab_trees.sh).
# - Experiment 85 (the default, VARIANTS="w32 w32m" RESULTS=row-address): `make_trees w32m` here with
#   row_address.patch applied, then .abcache/w32 a copy of w32m with the grouped mask copy as before
#   (the row address alone).
# - Experiment 86 (VARIANTS=mad RESULTS=mad): `make_trees mad` here with mad_wide.patch applied.
source benchmarks/experiments/hazards/ab_trees.sh
VARIANTS=${VARIANTS:-w32 w32m}
RESULTS=${RESULTS:-row-address}
build_2048 base $VARIANTS
AB=$(ab_command $VARIANTS)
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,32,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/$RESULTS-ab-glm.json 2>&1 | tail -n 6
$AB --indices uniform --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 --shape 4096,131072,128,576,2048 \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --shape 437,8192,64,576,2048 \
  --json $OUT/$RESULTS-ab-uniform.json 2>&1 | tail -n 8

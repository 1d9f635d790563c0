# Experiments 107-108 on the GPU machine, carrying .whl and .abcache (on the CPU host: apply
# prepass_384.patch, `source benchmarks/experiments/hazards/ab_trees.sh; make_trees p384`, restore).
# 107: the token-grouped call with its pre-pass free (free_prepass.py, main's kernels).
# 108: the one-wave pre-pass in CTAs of the grouped tile's 384 threads (what a build folded into the
#      grouped launch would have), against main's 1024, main timed twice: the calls' difference is the
#      pre-pass's.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base p384
in_tree base timeout 150 python3 $AB_ROOT/benchmarks/experiments/first_reads/free_prepass.py --s-q 1024 4096 \
  --json $OUT/free_prepass_glm.json 2>&1 | grep -v Warn | tail -12
AB="$(ab_command p384)"
$AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,131072,8,576,2048 --shape 4096,131072,8,576,2048 \
  --shape 4096,8192,8,576,2048 --json $OUT/ab_p384_glm.json 2>&1 | grep -v Warn | tail -6
$AB --indices realistic-dsv4 --shape 1024,131072,8,576,2048 --json $OUT/ab_p384_dsv4.json 2>&1 | grep -v Warn | tail -3

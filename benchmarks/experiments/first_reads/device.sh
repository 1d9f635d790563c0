# Experiments 105-106 on the GPU machine, carrying .whl and .abcache (on the CPU host: apply
# prefetch.patch, `source benchmarks/experiments/hazards/ab_trees.sh; make_trees pf`, restore; then
# apply stamps.patch, copy the tree to .abcache/stamps as make_trees does, restore).
# 105: the pre-pass's L2 prefetch of the grouped launch's first reads, against main, main timed twice.
# 106: the stamps of a token-grouped call's kernels (stamps.py), on main's kernels with stamps.patch.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base pf stamps
grep -h "spill" /tmp/j_pf/sm90a/*/*/build.log | sort | uniq -c
in_tree stamps timeout 120 python3 $AB_ROOT/benchmarks/experiments/first_reads/stamps.py --json $OUT/stamps_glm.json 2>&1 | grep -v Warn
AB="$(ab_command pf)"
$AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,8192,16,576,2048 --shape 1024,8192,32,576,2048 \
  --shape 1024,131072,8,576,2048 --shape 1024,131072,16,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,8192,32,576,2048 --json $OUT/ab_pf_glm.json 2>&1 | grep -v Warn | tail -10
$AB --indices realistic-dsv4 --shape 1024,131072,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_pf_dsv4.json 2>&1 | grep -v Warn | tail -4
$AB --shape 1024,8192,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_pf_uniform.json 2>&1 | grep -v Warn | tail -4

# Experiment 109 on the GPU machine, carrying .whl and .abcache (on the CPU host: apply stamps.patch
# then phases.patch, copy the tree to .abcache/st2 as the README says, restore): the one-wave
# pre-pass's phases stamped, at the short calls whose pre-pass runs CTAs of 1024 threads.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 st2
in_tree st2 timeout 200 python3 $AB_ROOT/benchmarks/experiments/first_reads/stamps.py --json $OUT/phases_glm.json \
  --shape 1024 8192 8 --shape 1024 131072 8 --shape 1024 8192 16 2>&1 | grep -v Warn | tail -60

# Experiment 97: the fold's cost, synthetic. `whole` cuts every list to whole pairs (whole_pairs.patch);
# `fold` adds to it, after each grouped unit's last pair, the consumers' share of the work a fold of
# 16 side rows each would add (fold_share.patch): both give wrong outputs by design, only times count.
# From the repository root on the GPU machine, carrying .whl and .abcache (trees: README.md beside this).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base whole fold
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant whole=/tmp/j_whole --variant fold=/tmp/j_fold --variant base2=/tmp/j_base"
timeout 240 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,8192,8,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 1024,8192,32,576,2048 --json $OUT/fold-glm.json 2>&1 | tail -n 8
timeout 90 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --json $OUT/fold-dsv4.json 2>&1 | tail -n 2

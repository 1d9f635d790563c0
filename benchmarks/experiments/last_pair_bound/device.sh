# Experiment 96 (a bound, not a kernel): every token group's list cut to whole pairs (whole), against
# main (base), main timed twice. From the repository root on the GPU machine, carrying .whl and
# .abcache (README.md beside this says how the trees are made). The cut lists drop rows, so `whole`'s
# outputs are wrong by design: only its times mean something.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base whole
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant whole=/tmp/j_whole --variant base2=/tmp/j_base"
timeout 200 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,8192,8,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 1024,8192,32,576,2048 --json $OUT/whole-glm.json 2>&1 | tail -n 8
timeout 90 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 \
  --json $OUT/whole-dsv4.json 2>&1 | tail -n 3

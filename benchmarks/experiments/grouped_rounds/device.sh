# Experiment 89 on the GPU machine, from the repository root (see README.md beside this).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base
AB=$(ab_command)
$AB --indices realistic-glm --shape 3960,8192,32,576,2048 --shape 4096,8192,32,576,2048 --shape 4224,8192,32,576,2048 \
  --shape 3960,131072,32,576,2048 --shape 4096,131072,32,576,2048 --shape 4224,131072,32,576,2048 \
  --shape 3696,131072,16,576,2048 --shape 4096,131072,16,576,2048 --shape 4224,131072,16,576,2048 \
  --json $OUT/rounds-glm.json 2>&1 | tail -n 11

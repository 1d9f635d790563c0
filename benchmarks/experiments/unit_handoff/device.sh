# The grouped tile's consumers take each unit from the producer through shared memory instead of
# loading it (ho1: the change of Experiment 92), against its parent (base) on grouped calls, the
# parent timed twice. From the repository root on the GPU machine, carrying .whl and .abcache (see
# README.md beside this for the trees).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base ho1
BASE=/tmp/j_base@.abcache/base/python/sparse_mla/launch.py
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=$BASE --variant ho1=/tmp/j_ho1 --variant base2=$BASE"
timeout 150 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,8192,8,576,2048 --shape 4096,131072,16,576,2048 --shape 1024,8192,8,576,2048 \
  --json $OUT/handoff-glm.json 2>&1 | tail -n 7
timeout 60 $AB --indices realistic-dsv4 --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 \
  --json $OUT/handoff-dsv4.json 2>&1 | tail -n 3

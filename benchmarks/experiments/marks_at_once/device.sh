# Experiment 94: the 1024-thread pre-pass marking every token's slots at once (mao), against its
# parent (base), the parent timed twice. From the repository root on the GPU machine, carrying .whl
# and .abcache (README.md beside this says how the trees are made).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base mao
PRE="python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base mao=/tmp/j_mao base2=/tmp/j_base"
S_Q=1024 CASES=realistic-glm:8192:8,realistic-glm:131072:8,realistic-dsv4:131072:8,uniform:8192:8,uniform:131072:8 \
  timeout 90 $PRE 2>&1 | tee $OUT/prepass-1024.txt | tail -n 5
CASES=realistic-glm:131072:8,realistic-dsv4:131072:8,uniform:131072:8,realistic-glm:8192:8 \
  timeout 90 $PRE 2>&1 | tee $OUT/prepass-4096.txt | tail -n 4
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant mao=/tmp/j_mao --variant base2=/tmp/j_base"
timeout 150 $AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,131072,8,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/mao-glm.json 2>&1 | tail -n 5
timeout 120 $AB --indices realistic-dsv4 --shape 1024,131072,8,576,2048 --shape 1024,8192,8,576,2048 \
  --shape 4096,131072,8,576,2048 --json $OUT/mao-dsv4.json 2>&1 | tail -n 4
timeout 80 $AB --indices uniform --shape 1024,8192,8,576,2048 --shape 1024,131072,8,576,2048 \
  --json $OUT/mao-uniform.json 2>&1 | tail -n 3

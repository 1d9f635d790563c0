# Experiment 103: what the grouped epilogue's stores cost, by mechanism. half (the grouped tile
# stores only its even 64-dim tiles: half the bytes, wrong outputs), membar (the grouped tile waits
# for its stores at the epilogue's end, __threadfence_block), cs (every 4-byte output store of the
# wide and grouped tiles evict-first in L2, __stcs); base (main) twice. On the GPU machine, carrying
# .whl and .abcache.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base half membar cs 2>&1 | tail -4
grep -h "spill" /tmp/j_*/sm90a/*/*/build.log | sort | uniq -c
V="--variant base=/tmp/j_base --variant half=/tmp/j_half --variant membar=/tmp/j_membar --variant cs=/tmp/j_cs --variant base2=/tmp/j_base"
timeout 330 python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices realistic-glm $V \
  --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,16,576,2048 --shape 4096,8192,64,576,2048 --shape 4096,131072,128,576,2048 \
  --json $OUT/ab_mechanism_glm.json 2>&1 | grep -v Warn | tail -9
timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 $V \
  --shape 4096,32768,128,576,2048 --shape 4096,131072,64,576,2048 --json $OUT/ab_mechanism_uniform.json 2>&1 | grep -v Warn | tail -4

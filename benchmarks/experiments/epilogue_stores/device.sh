# Experiment 102: the grouped epilogue's output in 16-byte stores (q16, the working tree), with its
# bounds: v4 (the same 16-byte stores without the lanes' transpose: wrong outputs), lines (today's
# 4-byte stores, each warp instruction in one 128-byte line instead of four: wrong outputs), nostore
# (the stores skipped at run time); base (main) twice. On the GPU machine, carrying .whl and .abcache.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base q16 v4 lines nostore 2>&1 | tail -5
grep -h "spill" /tmp/j_*/sm90a/*/*/build.log | sort | uniq -c
V="--variant base=/tmp/j_base --variant q16=/tmp/j_q16 --variant v4=/tmp/j_v4 --variant lines=/tmp/j_lines --variant nostore=/tmp/j_nostore --variant base2=/tmp/j_base"
timeout 300 python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices realistic-glm $V \
  --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,16,576,2048 --shape 1024,8192,32,576,2048 --shape 4096,8192,64,576,2048 \
  --json $OUT/ab_stores_glm.json 2>&1 | grep -v Warn | tail -9
timeout 120 python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices realistic-dsv4 $V \
  --shape 4096,131072,16,576,2048 --shape 1024,131072,8,576,2048 --json $OUT/ab_stores_dsv4.json 2>&1 | grep -v Warn | tail -4

# The grouped tile's unit boundary, bounds: `nostore` skips the output stores (the accumulators kept
# live), `pack` packs the output to bf16 before its stores, `magic` finds a row's token by a multiply; base twice. On the GPU machine, carrying
# .whl and .abcache (base, pack, nostore made on the CPU host).
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base pack nostore magic 2>&1 | tail -3
timeout 400 python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices realistic-glm --variant base=/tmp/j_base \
  --variant pack=/tmp/j_pack --variant nostore=/tmp/j_nostore --variant magic=/tmp/j_magic --variant base2=/tmp/j_base \
  --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 1024,8192,16,576,2048 --json $OUT/ab_bounds.json 2>&1 | grep -v Warn | tail -12

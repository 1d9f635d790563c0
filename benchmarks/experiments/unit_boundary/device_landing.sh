# Experiment 101's change (the grouped epilogue's rows mapped by a multiply) against its parent, the
# parent timed twice, then the tp tables on the change (tests/gpu next, by device_tests.sh). On the GPU machine, carrying
# .whl, .abcache (`make_trees mg`) and .incumbent.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees mg 2>&1 | tail -3
AB="timeout 300 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant mg=/tmp/j_mg --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 1024,8192,8,576,2048 --shape 1024,8192,32,576,2048 \
  --json $OUT/ab_mg_glm.json 2>&1 | grep -v Warn | tail -10
$AB --indices realistic-dsv4 --shape 1024,131072,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_mg_dsv4.json 2>&1 | grep -v Warn | tail -4
$AB --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_mg_uniform.json 2>&1 | grep -v Warn | tail -4
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_mg
for p in realistic-glm realistic-dsv4; do
  python3 benchmarks/tp.py --indices $p --incumbent .incumbent/sglang_q8kv8.so --iters 15 --out $OUT > $OUT/tp_$p.txt 2>&1; tail -24 $OUT/tp_$p.txt | grep -v Warn
done

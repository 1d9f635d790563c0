# Experiment 101's first try: the next unit's first Q.K^T beside the grouped tile's epilogue (c1,
# first_qk_beside.patch, which spilled 36 bytes) and noepi (the grouped epilogue's stores removed, which
# let the compiler drop every P.V wgmma: not a bound). On the GPU machine, carrying .whl and .abcache
# (base from the parent, c1 with the patch applied, noepi by hand).
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base c1 noepi 2>&1 | tail -3
grep -h "spill" /tmp/j_c1/sm90a/*/*/build.log | sort | uniq -c | head -5
timeout 400 python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices realistic-glm --variant base=/tmp/j_base --variant c1=/tmp/j_c1 --variant noepi=/tmp/j_noepi --variant base2=/tmp/j_base --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 --shape 1024,8192,16,576,2048 --shape 4096,8192,64,576,2048 --json $OUT/ab_c1.json 2>&1 | grep -v Warn | tail -25

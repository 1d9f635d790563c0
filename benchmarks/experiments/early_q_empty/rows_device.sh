# Experiment 124, fourth part: the wide tile early against main on the benchmark's rows (uniform, each
# variant its own outputs, compared bitwise), realistic-glm, random topk_length and the
# batch-invariant mode; each build under two names, 60 calls each. Same carry and trees as ncu_device.sh.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base early
in_tree early python3 -m sparse_mla prebuild --d-qk 512 --topk 512 -j 4 | tail -n 1
in_tree base python3 -m sparse_mla prebuild --d-qk 512 --topk 512 -j 4 | tail -n 1
AB="timeout 280 python3 benchmarks/experiments/hazards/ab.py --iters 60 --variant base=/tmp/j_base --variant early=/tmp/j_early --variant base2=/tmp/j_base --variant early2=/tmp/j_early"
$AB --json $OUT/rows_uniform.json 2>&1 | grep -v Warn | tail -n 11
$AB --shared-outputs --indices realistic-glm --json $OUT/rows_glm.json 2>&1 | grep -v Warn | tail -n 10
$AB --topk-length random --shape 4096,8192,64,576,2048 --shape 4096,32768,128,576,2048 --shape 437,8192,64,576,2048 --json $OUT/rows_lengths.json 2>&1 | grep -v Warn | tail -n 4
$AB --batch-invariant --shape 437,8192,64,576,2048 --shape 1024,65536,128,576,2048 --json $OUT/rows_bi.json 2>&1 | grep -v Warn | tail -n 3

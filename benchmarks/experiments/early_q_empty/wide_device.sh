# Experiment 99, second part: the wide tile releases Q early only where its unit is a whole item
# (wide_whole_items.patch; wsplit), against main with the grouped tile's early release (base), timed
# twice. From the repository root on the GPU machine, carrying .whl and .abcache (made here first:
# `git apply benchmarks/experiments/early_q_empty/wide_whole_items.patch;
# source benchmarks/experiments/hazards/ab_trees.sh && make_trees wsplit; git checkout include`).
source benchmarks/experiments/hazards/ab_trees.sh
for n in base wsplit; do in_tree $n python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 8 > /tmp/pb_$n.txt 2>&1 & done; wait
for n in base wsplit; do in_tree $n python3 -m sparse_mla prebuild --d-qk 512 --topk 512 -j 8 > /tmp/pb5_$n.txt 2>&1 & done; wait
tail -qn1 /tmp/pb_*.txt /tmp/pb5_*.txt
AB="python3 benchmarks/experiments/hazards/ab.py --iters 30 --variant base=/tmp/j_base --variant wsplit=/tmp/j_wsplit --variant base2=/tmp/j_base"
timeout 250 $AB --indices uniform --shape 437,8192,64,576,2048 --shape 437,8192,128,576,2048 --shape 4096,32768,64,576,2048 \
  --shape 4096,32768,128,576,2048 --shape 4096,8192,128,576,2048 --shape 1024,65536,128,576,2048 --shape 4096,8192,64,512,512 \
  --shape 4096,32768,64,512,512 --json $OUT/wsplit-uniform.json 2>&1 | tail -n 9
timeout 100 $AB --indices uniform --topk-length random --shape 4096,8192,64,576,2048 --shape 4096,32768,128,576,2048 --json $OUT/wsplit-lengths.json 2>&1 | tail -n 3

# Experiment 80 on the GPU machine (`bash chain_device.sh ab`, then `bash chain_device.sh tests`), from
# the repository root, carrying .abcache, after `make_trees chain` (hazards/ab_trees.sh) here, HEAD the
# commit before the change and the working tree with it: whole calls of both side by side at 1024 and
# 4096 rows (all grouped, all one by one, and a wide-tile control), then the changed tree's tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
if [ "$1" = ab ]; then
  build_2048 base chain
  AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant chain=/tmp/j_chain --variant base2=/tmp/j_base"
  $AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,8192,16,576,2048 --shape 1024,8192,32,576,2048 \
    --shape 1024,131072,8,576,2048 --shape 1024,131072,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 \
    --shape 4096,8192,32,576,2048 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 \
    --shape 4096,8192,64,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 14
  $AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,131072,8,576,2048 --shape 1024,8192,16,576,2048 \
    --shape 1024,131072,32,576,2048 --json $OUT/ab_uniform.json 2>&1 | tail -n 6
  $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 1024,131072,8,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -n 4
else
  in_tree chain python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 | tail -n 1
  in_tree chain python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -n 1
  (in_tree chain timeout 400 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_chain.txt 2>&1; tail -n 6 $OUT/tests_chain.txt)
fi

# Experiment 104's tree (.abcache/rows, built by device_rows.sh into /tmp/j_rows, built again if the
# machine is a fresh one): tests/gpu in full. On the GPU machine, carrying .whl and .abcache.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
if [ ! -d /tmp/j_rows/sm90a ]; then
  in_tree rows python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 | tail -1
  in_tree rows python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -1
fi
in_tree rows timeout 560 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_gpu_rows.txt 2>&1
tail -8 $OUT/tests_gpu_rows.txt

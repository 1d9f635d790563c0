# Experiment 104's tree (.abcache/rows; its kernels in /tmp/j_rows from device_rows.sh, built again if
# the machine is a fresh one): the tp tables on realistic-glm and realistic-dsv4 indices, the incumbent
# timed in the same run. On the GPU machine, carrying .whl, .abcache and .incumbent.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
if [ ! -d /tmp/j_rows/sm90a ]; then in_tree rows python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 | tail -1; fi
export PYTHONPATH=$AB_ROOT/.abcache/rows/python:$PYTHONPATH SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_rows
export SPARSE_MLA_COMMIT="$(git rev-parse HEAD 2>/dev/null)+contiguous_rows.patch"
for p in realistic-glm realistic-dsv4; do
  python3 benchmarks/tp.py --indices $p --incumbent .incumbent/sglang_q8kv8.so --iters 15 --out $OUT > $OUT/tp_$p.txt 2>&1
  tail -24 $OUT/tp_$p.txt | grep -v Warn
done

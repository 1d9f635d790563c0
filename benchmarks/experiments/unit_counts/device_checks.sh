# Experiment 126's checks on the GPU machine (carry .whl and .incumbent): `tests`, the GPU tests on the
# working tree's kernel; `tp`, the tp tables with the incumbent. SPARSE_MLA_COMMIT names the commit.
source .whl/prelude.sh >/dev/null 2>&1
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/jc
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
case "$1" in
  tests)
    python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 14 > $OUT/prebuild.log 2>&1
    python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 4 >> $OUT/prebuild.log 2>&1
    tail -n 2 $OUT/prebuild.log
    timeout 420 python3 -m pytest -q -rs tests/gpu > $OUT/tests_gpu.log 2>&1; tail -n 8 $OUT/tests_gpu.log ;;
  tp)
    python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 4 > $OUT/prebuild.log 2>&1
    for ix in realistic-glm realistic-dsv4 uniform; do
      python3 benchmarks/tp.py --indices $ix --incumbent .incumbent/sglang_q8kv8.so --out $OUT 2>&1 \
        | grep -v Warn > $OUT/tp-$ix.log; tail -n 22 $OUT/tp-$ix.log
    done ;;
esac

# tests/gpu on the working tree, its kernels from /tmp/j_mg (device_landing.sh), built again if the
# machine is a fresh one.
source .whl/prelude.sh >/dev/null 2>&1
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_mg
if [ ! -d /tmp/j_mg/sm90a ]; then
  python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 | tail -1
  python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -1
fi
timeout 560 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_gpu.txt 2>&1; tail -8 $OUT/tests_gpu.txt

# Experiment 123 on the GPU machine (carry .whl): main's kernels, built once, then the bound.
source .whl/prelude.sh >/dev/null 2>&1
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/jc
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 > $OUT/prebuild.log 2>&1 || tail -20 $OUT/prebuild.log
python3 benchmarks/experiments/hybrid_split/bound.py --json $OUT/bound.json "$@" 2>&1 | grep -v Warn

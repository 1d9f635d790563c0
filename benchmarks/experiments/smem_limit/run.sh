# Experiment 144 on the device, from a tree with smem_limit.patch applied (carry .whl, .jcb: HEAD's
# 576/2048 prebuilt here before applying the patch, and .jc144: the patched tree's, --cache-dir .jc144).
source .whl/prelude.sh > /tmp/prelude.txt 2>&1; tail -1 /tmp/prelude.txt
T0=$SECONDS
timeout 200 python3 benchmarks/experiments/smem_limit/ab_smem_limit.py base=.jcb new=.jc144 2>&1 | grep -v "^sparse_mla:"
echo "ab at $((SECONDS-T0)) s"
export SPARSE_MLA_JIT_CACHE_DIR=$PWD/.jc144
python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 4096 -j 16 > $OUT/prebuild.log 2>&1
python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 2048 -j 16 >> $OUT/prebuild.log 2>&1; tail -1 $OUT/prebuild.log
timeout $((570 - (SECONDS-T0))) python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=short -rf -k "not sanitizer_finds_nothing" > $OUT/tier.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/tier.log | cut -c1-250 | tail -10
echo "tier at $((SECONDS-T0)) s"

# Experiment 142 on the device, from a tree with converted_rows.patch applied (carry .whl and, if built
# here, the patched tree's cache as .jc142: prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 and
# --d-qk 512 --topk 64 512 2048 --cache-dir .jc142).
source .whl/prelude.sh > /tmp/prelude.txt 2>&1; tail -1 /tmp/prelude.txt
export SPARSE_MLA_JIT_CACHE_DIR=$PWD/.jc142
T0=$SECONDS
timeout 240 python3 -m pytest tests/gpu/test_paged.py -q -p no:cacheprovider --tb=short -rf > $OUT/paged.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/paged.log | cut -c1-250 | tail -12
echo "paged tests at $((SECONDS-T0)) s"
timeout 240 python3 benchmarks/experiments/converted_rows/ab_conversion.py --json $OUT/ab_conversion.json 2>&1 | grep -v "^sparse_mla:"
echo "ab at $((SECONDS-T0)) s"

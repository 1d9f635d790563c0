# Experiment 142 on the device, from a tree with converted_rows.patch applied (carry .whl and the
# patched tree's cache as .jc142, made here: prebuild --d-qk 576 --topk 2048 and --d-qk 512 --topk 512
# --cache-dir .jc142, the keys test_paged.py and ab_conversion.py use; 6-7 MB a key).
source .whl/prelude.sh > /tmp/prelude.txt 2>&1; tail -1 /tmp/prelude.txt
export SPARSE_MLA_JIT_CACHE_DIR=$PWD/.jc142
T0=$SECONDS
timeout 240 python3 -m pytest tests/gpu/test_paged.py -q -p no:cacheprovider --tb=short -rf > $OUT/paged.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/paged.log | cut -c1-250 | tail -12
echo "paged tests at $((SECONDS-T0)) s"
timeout 240 python3 benchmarks/experiments/converted_rows/ab_conversion.py --json $OUT/ab_conversion.json 2>&1 | grep -v "^sparse_mla:"
echo "ab at $((SECONDS-T0)) s"

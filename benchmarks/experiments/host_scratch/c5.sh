# Experiment 140 on the device, from the patched tree's root (carry .whl .jcs)
source .whl/prelude.sh > /tmp/prelude.txt 2>&1; tail -1 /tmp/prelude.txt
export SPARSE_MLA_JIT_CACHE_DIR=$PWD/.jcs  # the patched tree's prebuilt keys (576/2048, 512/512, 576/512, 512/2048)
T0=$SECONDS
timeout 90 python3 benchmarks/experiments/host_scratch/ab_scratch.py 2>&1 | grep -v "^sparse_mla:" | tail -8
echo "ab at $((SECONDS-T0)) s"
python3 -m sparse_mla prebuild --d-qk 576 512 --topk 64 7 100 1 4096 -j 16 > $OUT/prebuild.log 2>&1; tail -1 $OUT/prebuild.log
echo "prebuild at $((SECONDS-T0)) s"
timeout $((290 - (SECONDS-T0))) python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=short -rf -k "not sanitizer_finds_nothing" > $OUT/tier.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/tier.log | cut -c1-250 | tail -12
echo "tier at $((SECONDS-T0)) s"

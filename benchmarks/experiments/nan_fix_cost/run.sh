# Experiment 143 on the device, from the repository root (carry .whl and .abcache, made here first:
#   git apply benchmarks/experiments/nan_fix_cost/nofix.patch && benchmarks/ab.sh trees nofix \
#     && git apply -R benchmarks/experiments/nan_fix_cost/nofix.patch
# ). HEAD (base, and again as base2: the noise floor) against HEAD without the NaN fix (nofix), on the
# 12 tensor-parallel cells with token groups, realistic-glm then realistic-dsv4.
source .whl/prelude.sh > /tmp/prelude.txt 2>&1; tail -1 /tmp/prelude.txt
T0=$SECONDS
benchmarks/ab.sh build nofix > $OUT/abbuild.log 2>&1; tail -2 $OUT/abbuild.log
echo "build at $((SECONDS-T0)) s"
SH=""; for s in 1024 4096; do for k in 8192 131072; do for h in 8 16 32; do SH="$SH --shape $s,$k,$h,576,2048"; done; done; done
for preset in realistic-glm realistic-dsv4; do
  timeout 200 benchmarks/ab.sh time nofix -- --indices $preset $SH --iters 40 --json $OUT/ab_$preset.json > $OUT/ab_$preset.log 2>&1
  grep -v "^sparse_mla:" $OUT/ab_$preset.log | tail -16
  echo "$preset at $((SECONDS-T0)) s"
done

# Where the wide tile's early Q release costs a fixed ~2.7 us a CTA (Experiment 124, measurement): ncu's
# source counters of the wide kernel at 132 x 8K, h_q 64 (one unit a CTA), main (base) and the wide tile
# early (early: EARLY_Q_EMPTY true for kWide too), and the two timed side by side. From the repository
# root on the GPU machine, carrying .whl and .abcache (made first: EARLY_Q_EMPTY set for kWide too,
# `source benchmarks/experiments/hazards/ab_trees.sh && make_trees early`, then `git checkout include`).
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base early
for v in base early; do
  in_tree $v timeout 150 ncu --clock-control none -k regex:prefill_kernel --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --page source --print-source sass --csv \
    python3 $AB_ROOT/benchmarks/experiments/early_q_empty/wide_once.py 132 64 > /tmp/src_$v.csv 2> $OUT/ncu_$v.err
  python3 benchmarks/experiments/tile_stalls/summarize.py /tmp/src_$v.csv 40 > $OUT/stalls_$v.txt 2>&1
  gzip -c /tmp/src_$v.csv > $OUT/src_$v.csv.gz
  in_tree $v timeout 100 ncu --clock-control none -k regex:prefill_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    python3 $AB_ROOT/benchmarks/experiments/early_q_empty/wide_once.py 132 64 2>&1 | grep -E "Duration|Elapsed Cycles|SM Frequency|Registers|Shared Memory Config" 
done
$(ab_command early) --iters 40 --indices uniform --shape 132,8192,64,576,2048 --shape 4096,8192,64,576,2048 --json $OUT/ab.json 2>&1 | grep -v Warn | tail -n 4

# The grouped kernel under ncu (realistic-glm 4096 x 8K, h_q 32, groups forced on): warp states and
# per-instruction source counters. On the GPU machine, carrying .whl; writes under $OUT.
source .whl/prelude.sh >/dev/null 2>&1
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 2>&1 | tail -1
D=benchmarks/experiments/epilogue_stores
K="--clock-control none --kernel-name-base mangled -k regex:TileE2E -s 2 -c 1"
timeout 200 ncu $K --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
  python3 $D/ncu_grouped.py 4096 8192 32 > $OUT/ncu_grouped.txt 2>&1
grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Throughput" $OUT/ncu_grouped.txt | head -20
timeout 250 ncu $K --section SourceCounters --page source --print-source sass --csv \
  python3 $D/ncu_grouped.py 4096 8192 32 > $OUT/src_grouped.csv 2>&1
python3 $D/ncu_summary.py $OUT/src_grouped.csv 2>&1 | tee $OUT/src_summary.txt | tail -50

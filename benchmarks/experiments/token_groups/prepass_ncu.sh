# The pre-pass under ncu, realistic-glm, 4096 rows: issue, occupancy, stall and memory sections per
# case, and one case's source counters (on the GPU machine, from the repository root, carrying .whl;
# writes under $OUT). CASES (pattern:s_kv:h_q, comma-separated) and SOURCE_CASE choose them; by
# default groups of 8 at s_kv 128K and 8K and of 4 at 128K, the source counters at 128K, groups of 8.
source .whl/prelude.sh
CASES=${CASES:-realistic-glm:131072:8,realistic-glm:8192:8,realistic-glm:131072:16}
SOURCE_CASE=${SOURCE_CASE:-realistic-glm:131072:8}
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 2>&1 | tail -1
J=$(python3 -c "from sparse_mla.jit import env; print(env.cache_dir())" 2>/dev/null || echo ~/.cache/sparse_mla)
echo "cache $J"; ls $J
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
P=benchmarks/experiments/token_groups/prepass_ab.py
for c in ${CASES//,/ }; do
  n=$(echo $c | tr ':' '_')
  CASES=$c timeout 150 ncu --clock-control none -k regex:prefill_kernel_token_groups -c 1 $S python3 $P main=$J > $OUT/ncu_$n.txt 2>&1
  grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Registers Per|Block Size|Dynamic Shared" $OUT/ncu_$n.txt | head -14
done
CASES=$SOURCE_CASE timeout 150 ncu --clock-control none -k regex:prefill_kernel_token_groups -c 1 --section SourceCounters --page source --print-source sass --csv python3 $P main=$J > $OUT/src_$(echo $SOURCE_CASE | tr ':' '_').csv 2>&1
ls -la $OUT

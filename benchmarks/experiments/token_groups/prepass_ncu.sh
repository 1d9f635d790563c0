# The pre-pass under ncu at groups of 8 (s_kv 128K and 8K) and of 4 (128K), realistic-glm, 4096 rows:
# issue, occupancy, stall and memory sections, and the 128K case's source counters (on the GPU machine,
# from the repository root, carrying .whl; writes under $OUT).
source .whl/prelude.sh
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 2>&1 | tail -1
J=$(python3 -c "from sparse_mla.jit import env; print(env.cache_dir())" 2>/dev/null || echo ~/.cache/sparse_mla)
echo "cache $J"; ls $J
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
P=benchmarks/experiments/token_groups/prepass_ab.py
for c in realistic-glm:131072:8 realistic-glm:8192:8 realistic-glm:131072:16; do
  n=$(echo $c | tr ':' '_')
  CASES=$c timeout 150 ncu --clock-control none -k regex:prefill_kernel_token_groups -c 1 $S python3 $P main=$J > $OUT/ncu_$n.txt 2>&1
  grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Registers Per|Block Size|Dynamic Shared" $OUT/ncu_$n.txt | head -14
done
CASES=realistic-glm:131072:8 timeout 150 ncu --clock-control none -k regex:prefill_kernel_token_groups -c 1 --section SourceCounters --page source --print-source sass --csv python3 $P main=$J > $OUT/src_128k_g8.csv 2>&1
ls -la $OUT

# Where kv does not fit L2: the gather-bound calls under ncu (DRAM and L2 throughput, L2 hit rate), on
# the GPU machine from the repository root, carrying .whl; writes under $OUT.
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 2>&1 | tail -1
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables"
for c in uniform:131072:16 uniform:131072:64 uniform:8192:16 realistic-dsv4:131072:16; do
  n=$(echo $c | tr ':' '_')
  CASE=$c timeout 100 ncu --clock-control none -k regex:prefill_kernel --launch-skip 1 -c 1 $S \
    --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    python3 benchmarks/experiments/l2_hint/gather_ncu.py > $OUT/ncu_$n.txt 2>&1
  echo "== $c"; grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|dram__bytes_read.sum|lts__t_sector_hit_rate|dram__throughput|Max Bandwidth|L2 Compression" $OUT/ncu_$n.txt | head -12
done

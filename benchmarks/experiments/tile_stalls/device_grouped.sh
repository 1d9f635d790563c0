# Where the grouped tile's warps wait (Experiment 121, measurement): ncu's SASS source page of one
# grouped launch (realistic-glm, 4096 x 8K, h_q 16 and 8) and of the wide tile (h_q 64, the same
# indices) for comparison, summarized by summarize.py. From the repository root on the GPU machine,
# carrying .whl.
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/jc PYTHONPATH=$PWD/python:$PYTHONPATH
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 | tail -n 1
NCU="ncu --clock-control none --kernel-name-base demangled -k regex:prefill_kernel< --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv"
for h in 16 8 64; do
  skip=2; [ $h = 64 ] && skip=1  # one launch a call at 64 heads
  timeout 150 $NCU --launch-skip $skip python3 benchmarks/experiments/tile_stalls/grouped_once.py $h > /tmp/grp_h$h.csv 2> $OUT/ncu_grp_h$h.err
  python3 benchmarks/experiments/tile_stalls/summarize.py /tmp/grp_h$h.csv 30 > $OUT/stalls_grouped_h$h.txt 2>&1
  gzip -c /tmp/grp_h$h.csv > $OUT/src_grouped_h$h.csv.gz
  head -n 4 $OUT/stalls_grouped_h$h.txt
done

# Where the narrow tiles' pair loop waits (measurement): ncu's SASS source page with stall sampling
# of the 16- and 8-head tiles alone (uniform, token groups off, 4096 x 8K), summarized per opcode and
# instruction by summarize.py. From the repository root on the GPU machine, carrying .whl.
export SPARSE_MLA_JIT_CACHE_DIR=/tmp/jc PYTHONPATH=$PWD/python:$PYTHONPATH
python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 16 | tail -n 1
ncu --version | tail -n 1
for h in 16 8; do
  timeout 200 ncu --clock-control none -k regex:prefill_kernel --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python3 benchmarks/experiments/gather_bandwidth/narrow_once.py $h > /tmp/src_h$h.csv 2> $OUT/ncu_h$h.err
  python3 benchmarks/experiments/tile_stalls/summarize.py /tmp/src_h$h.csv 45 > $OUT/stalls_h$h.txt 2>&1
  gzip -c /tmp/src_h$h.csv > $OUT/src_h$h.csv.gz
  head -n 32 $OUT/stalls_h$h.txt
done

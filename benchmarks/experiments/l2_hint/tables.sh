# On the GPU machine, from the repository root, carrying .whl and .incumbent: main's kernel built at
# every key the tests use, the tp tables of the three index patterns with the incumbent, then tests/gpu.
python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 2>&1 | tail -n 1
python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 2>&1 | tail -n 1
mkdir -p $OUT/tp
for p in uniform realistic-glm realistic-dsv4; do
  timeout 120 python3 benchmarks/tp.py --indices $p --incumbent .incumbent/sglang_q8kv8.so --iters 15 --out $OUT/tp \
    > $OUT/tp/$p.txt 2>&1; grep -v "^measured\|Warn\|warn" $OUT/tp/$p.txt | tail -n 21 | cut -c1-110
done
timeout 330 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests.txt 2>&1; tail -n 6 $OUT/tests.txt

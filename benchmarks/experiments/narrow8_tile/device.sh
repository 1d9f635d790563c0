# An 8-head narrow tile against main, side by side (run on the GPU machine from the repository root, after
# `bash benchmarks/experiments/narrow8_tile/prepare.sh` here): token groups off at h_q 4, 8 and 16 (the
# control), then with token groups on at s_kv 12K and 16K, where groups of 8 cross the union threshold.
R=$PWD
pb() { (cd $1 && PYTHONPATH=$1/python:/tmp/site SPARSE_MLA_JIT_CACHE_DIR=$2 python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 8 > /tmp/pb_$3.txt 2>&1; tail -1 /tmp/pb_$3.txt); }
pb $R/.abcache/hd /tmp/j_hd hd & pb $R/.abcache/n8 /tmp/j_n8 n8 & wait
AB="python3 benchmarks/experiments/hazards/ab.py --iters 25"
$AB --variant head=/tmp/j_hd:never --variant n8=/tmp/j_n8:never --shape 4096,8192,8,576,2048 --shape 4096,131072,8,576,2048 \
  --shape 1024,8192,8,576,2048 --shape 4096,8192,4,576,2048 --shape 4096,8192,16,576,2048 --json $OUT/ab_n8.json
$AB --variant head=/tmp/j_hd --variant n8=/tmp/j_n8 --variant n8never=/tmp/j_n8:never --shape 4096,12288,8,576,2048 \
  --shape 4096,16384,8,576,2048 --json $OUT/ab_n8_auto.json

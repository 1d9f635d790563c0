# Experiment 126 on the GPU machine (carry .whl and .abcache, made here by
# `source benchmarks/experiments/hazards/ab_trees.sh && make_trees zc` with the change in the working
# tree): HEAD's kernel (base, with HEAD's launch plan, whose torch.zeros zeroes the counters) against
# the working tree's (zc: a kernel of its own zeroes them), each under two names, 60 calls each.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base zc
base="/tmp/j_base@.abcache/base/python/sparse_mla/launch.py"
ab() {
  local indices=$1 tag=$2; shift 2
  local shapes=()
  for s in "$@"; do shapes+=(--shape "$s"); done
  timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 60 --indices "$indices" \
    --variant "base=$base" --variant zc=/tmp/j_zc --variant "base2=$base" --variant zc2=/tmp/j_zc \
    "${shapes[@]}" --json "$OUT/ab-$tag.json" 2>/dev/null | tee "$OUT/ab-$tag.txt"
}
# token groups: the pre-pass's counts
ab realistic-glm glm 1024,8192,8,576,2048 1024,8192,16,576,2048 1024,8192,32,576,2048 \
  1024,131072,8,576,2048 1024,131072,16,576,2048 4096,8192,16,576,2048 4096,131072,8,576,2048
ab realistic-dsv4 dsv4 1024,131072,8,576,2048 1024,8192,8,576,2048
# the tail split's counters (437 x 8K, 4096 x 8K and 128K at h_q 128 split), and calls of neither kind
ab uniform uniform 437,8192,64,576,2048 150,8192,128,576,2048 4096,8192,128,576,2048 \
  4096,131072,128,576,2048 4096,8192,16,576,2048 4092,8192,64,576,2048

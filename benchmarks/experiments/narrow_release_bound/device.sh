# Experiment 119: the narrow tiles' V loads. Bounds (wrong outputs): each pair's stage released right
# after its Q.K^T, before its softmax, V still read after it (rel: racy), and the same without the V
# loads (nov); and a correct reorder: a pair's V loads under the next pair's Q.K^T (vq). Against their
# parent (base) twice, token groups off, uniform indices. From the repository root on the GPU
# machine, carrying .whl and .abcache (README.md beside this says how the trees are made).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base rel nov vq
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --indices uniform"
timeout 200 $AB --variant base=/tmp/j_base:never --variant rel=/tmp/j_rel:never --variant nov=/tmp/j_nov:never \
  --variant base2=/tmp/j_base:never --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,8192,8,576,2048 --shape 4096,131072,8,576,2048 --shape 4096,8192,32,576,2048 \
  --json $OUT/bound-uniform.json 2>&1 | tail -n 7
timeout 200 $AB --variant base=/tmp/j_base:never --variant vq=/tmp/j_vq:never --variant nov=/tmp/j_nov:never \
  --variant base2=/tmp/j_base:never --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 4096,8192,32,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,64,576,2048 \
  --json $OUT/vq-uniform.json 2>&1 | tail -n 7

# The working tree's change against HEAD, side by side on the GPU machine (from the repository root,
# after `make_trees e66` (../hazards/ab_trees.sh) here; carry .abcache): grouped calls, the wide tile
# with per-row topk_length
# (where a unit's last pair often holds one block), the controls; then the changed tree's tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees e66
AB="python3 benchmarks/experiments/hazards/ab.py --iters 25 --variant base=/tmp/j_base --variant e66=/tmp/j_e66"
$AB --indices realistic-glm --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,131072,32,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -8
$AB --indices realistic-dsv4 --shape 4096,8192,16,576,2048 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,8192,32,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -6
$AB --topk-length random --shape 4096,8192,64,576,2048 --shape 4096,32768,128,576,2048 --shape 4096,8192,16,576,2048 \
  --shape 4096,8192,32,576,2048 --json $OUT/ab_lengths.json 2>&1 | tail -6
$AB --shape 4096,8192,64,576,2048 --shape 4096,32768,128,576,2048 --shape 437,8192,64,576,2048 --shape 4096,8192,16,576,2048 \
  --json $OUT/ab_uniform.json 2>&1 | tail -6
(in_tree e66 timeout 330 python3 -m pytest tests/gpu -q -rs -x -p no:cacheprovider > $OUT/tests_e66.txt 2>&1; tail -4 $OUT/tests_e66.txt)

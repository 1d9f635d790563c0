# Experiment 78 on the GPU machine (`bash bitmaps_device.sh`), from the repository root, carrying
# .abcache, after `make_trees bm` (hazards/ab_trees.sh) here, HEAD the commit before the change and
# the working tree with it: both trees built at topk 2048; the pre-pass side by side with the lists
# compared, then whole calls (groups of four: h_q 16; of two: h_q 32, whose kernel is now the same
# template; of eight, unchanged: a control).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base bm
CASES=realistic-glm:8192:16,realistic-glm:131072:16,realistic-dsv4:8192:16,realistic-dsv4:131072:16,uniform:8192:16,uniform:131072:16,realistic-glm:8192:32,realistic-glm:131072:32,uniform:131072:32,realistic-glm:131072:8 \
  timeout 170 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base bm=/tmp/j_bm base2=/tmp/j_base 2>&1 | tee $OUT/prepass_ab.txt | grep -v Warn
AB="timeout 160 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant bm=/tmp/j_bm --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,8,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 6
$AB --indices realistic-dsv4 --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -n 4
$AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_uniform.json 2>&1 | tail -n 4

# Experiment 67 on the GPU machine (from the repository root, carrying .abcache, after `make_trees
# e67` (../hazards/ab_trees.sh) here, HEAD the commit before the change and the working tree with
# it): the pre-pass of both side by
# side with their lists compared, whole calls, then the changed tree's tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees e67
CASES=realistic-glm:131072:8,realistic-dsv4:131072:8,uniform:131072:8,realistic-glm:8192:8,realistic-glm:131072:16 \
  python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base e67=/tmp/j_e67 base2=/tmp/j_base 2>&1 | tee $OUT/prepass_ab.txt | grep -v Warn
AB="python3 benchmarks/experiments/hazards/ab.py --iters 25 --variant base=/tmp/j_base --variant e67=/tmp/j_e67"
$AB --indices realistic-glm --shape 4096,131072,8,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -3
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -2
(in_tree e67 timeout 330 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_e67.txt 2>&1; tail -4 $OUT/tests_e67.txt)

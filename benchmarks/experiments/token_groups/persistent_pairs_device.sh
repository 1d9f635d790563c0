# Experiment 83 on the GPU machine (`bash persistent_pairs_device.sh`, from the repository root,
# carrying .whl and .abcache), after `make_trees p2` (hazards/ab_trees.sh) here, HEAD the commit
# before the change and the working tree with it: the groups-of-two pre-pass (persistent CTAs that
# stage their next group's slots) beside its base, its lists compared, at 4096 and 1024 rows (groups
# of 4 as a control: their kernel did not change), then whole calls. `tests/gpu` on the changed tree
# follows in a call of its own (TESTS=1).
source benchmarks/experiments/hazards/ab_trees.sh
if [ -n "$TESTS" ]; then
  (in_tree p2 timeout 420 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_p2.txt 2>&1; tail -n 6 $OUT/tests_p2.txt)
  exit
fi
ab_trees p2
PREPASS="timeout 100 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base p2=/tmp/j_p2 base2=/tmp/j_base"
CASES=realistic-glm:8192:32,realistic-glm:32768:32,realistic-glm:131072:32,realistic-dsv4:8192:32,realistic-dsv4:131072:32,uniform:8192:32,uniform:131072:32,realistic-glm:8192:16 \
  $PREPASS 2>&1 | grep -v Warn | tee $OUT/prepass_4096.txt
S_Q=1024 CASES=realistic-glm:8192:32,realistic-glm:131072:32,uniform:8192:32 $PREPASS 2>&1 | grep -v Warn | tee $OUT/prepass_1024.txt
AB="timeout 120 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant p2=/tmp/j_p2 --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,8192,24,576,2048 \
  --shape 1024,8192,32,576,2048 --shape 1024,131072,32,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 6
$AB --indices realistic-dsv4 --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -n 3
$AB --indices uniform --shape 4096,8192,32,576,2048 --shape 1024,8192,32,576,2048 --json $OUT/ab_uniform.json 2>&1 | tail -n 3

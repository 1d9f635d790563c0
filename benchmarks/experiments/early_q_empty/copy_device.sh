# Experiment 124, second part: is the short calls' fixed cost the early build's, or the A/B method's?
# ab.py loads a root's module once, so `base` and `base2` run one copy of the code and `early` another;
# `copy` is the base build loaded from a copy of its cache root (the same code, loaded apart). Same
# carry and trees as ncu_device.sh.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base early
rm -rf /tmp/j_copy && cp -r /tmp/j_base /tmp/j_copy
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 40 --indices uniform"
SHAPES="--shape 132,8192,64,576,2048 --shape 437,8192,64,576,2048 --shape 4096,8192,64,576,2048"
$AB --variant base=/tmp/j_base --variant copy=/tmp/j_copy --variant early=/tmp/j_early --variant base2=/tmp/j_base \
  $SHAPES --json $OUT/copy.json 2>&1 | grep -v Warn | tail -n 4
$AB --variant early=/tmp/j_early --variant base=/tmp/j_base --variant early2=/tmp/j_early \
  $SHAPES --json $OUT/early_first.json 2>&1 | grep -v Warn | tail -n 4

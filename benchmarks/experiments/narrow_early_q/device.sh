# Experiment 125: the narrow tiles release Q once a unit's last Q.K^T is retired (narrow_early_q.patch)
# against main, both under two names, 60 calls. From the repository root on the GPU machine, carrying
# .whl and .abcache (made first: apply the patch, `source benchmarks/experiments/hazards/ab_trees.sh &&
# make_trees nearly`, then `git checkout include`).
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base nearly
AB="timeout 250 python3 benchmarks/experiments/hazards/ab.py --iters 60 --variant base=/tmp/j_base --variant nearly=/tmp/j_nearly --variant base2=/tmp/j_base --variant nearly2=/tmp/j_nearly"
$AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,8192,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 1024,8192,16,576,2048 --json $OUT/uniform.json 2>&1 | grep -v Warn | tail -n 6
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --shape 1024,131072,8,576,2048 \
  --json $OUT/dsv4.json 2>&1 | grep -v Warn | tail -n 4

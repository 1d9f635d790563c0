# Experiment 99, third part: both tiles early (EARLY_Q_EMPTY true; both) against main (base) on short
# uniform calls, with and without the tail split (--batch-invariant). From the repository root on the GPU
# machine, carrying .whl and .abcache (made first: EARLY_Q_EMPTY set to true, then
# `source benchmarks/experiments/hazards/ab_trees.sh && make_trees both; git checkout include`).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base both
AB="python3 benchmarks/experiments/hazards/ab.py --iters 40 --variant base=/tmp/j_base --variant both=/tmp/j_both --variant base2=/tmp/j_base --indices uniform"
timeout 120 $AB --shape 437,8192,64,576,2048 --shape 396,8192,64,576,2048 --shape 264,8192,64,576,2048 --shape 600,8192,64,576,2048 --json $OUT/both-short.json 2>&1 | tail -n 5
timeout 60 $AB --batch-invariant --shape 437,8192,64,576,2048 --shape 396,8192,64,576,2048 --json $OUT/both-short-bi.json 2>&1 | tail -n 3

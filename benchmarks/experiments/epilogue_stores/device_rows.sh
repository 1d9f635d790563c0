# Experiment 104 (landed in 6854b93): the grouped epilogue stores a token group's rows as the wide
# tile stores its heads where the output's (token, head) dims are contiguous (contiguous_rows.patch:
# rows, with the out-view test at 16 heads in token groups), against main, main timed twice; then the
# patch's out-view and token-group tests. On the CPU host: `git apply
# benchmarks/experiments/epilogue_stores/contiguous_rows.patch; source
# benchmarks/experiments/hazards/ab_trees.sh; make_trees rows; git checkout include tests`. On the GPU
# machine, carrying .whl and .abcache; tests/gpu in full after (unit_boundary/device_tests.sh's way,
# in_tree rows).
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees rows 2>&1 | tail -3
grep -h "spill" /tmp/j_rows/sm90a/*/*/build.log | sort | uniq -c
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant rows=/tmp/j_rows --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 1024,8192,16,576,2048 --shape 4096,8192,64,576,2048 \
  --json $OUT/ab_rows_glm.json 2>&1 | grep -v Warn | tail -9
$AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 1024,131072,8,576,2048 --json $OUT/ab_rows_dsv4.json 2>&1 | grep -v Warn | tail -4
in_tree rows timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_correctness.py -k out_views 2>&1 | tail -3

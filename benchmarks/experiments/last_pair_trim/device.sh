# Experiment 98: where a token group's last, nearly empty pair spends its time. Side by side with the
# parent (base), timed twice: `trim` multiplies only the rows of the last pair that hold entries
# (trim.patch), `nogather` computes it whole but gathers none of its rows (nogather.patch, wrong
# outputs), `whole` drops it (../last_pair_bound/whole_pairs.patch, wrong outputs). From the
# repository root on the GPU machine, carrying .whl and .abcache, made here first:
#   git apply P; tar -c include python tests pyproject.toml | tar -x -C .abcache/NAME; git checkout include
# for each (NAME, P), and .abcache/base by `source benchmarks/experiments/hazards/ab_trees.sh; make_trees`.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base trim nogather whole
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant trim=/tmp/j_trim --variant nogather=/tmp/j_nogather --variant whole=/tmp/j_whole --variant base2=/tmp/j_base"
timeout 330 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --json $OUT/lastpair-glm.json 2>&1 | tail -n 6
timeout 100 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --json $OUT/lastpair-dsv4.json 2>&1 | tail -n 2

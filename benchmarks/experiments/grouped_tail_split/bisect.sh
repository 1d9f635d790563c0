# Which change slows the grouped tile (see README.md beside this): main, main with the producer's mask
# copy ahead of the rows (base5), the split with it (gsplit) and with the mask pointers stepped
# instead (gsplit6), timed side by side. The trees: main, main with that move, the patch with
# grouped_tail_split.patch's producer replaced by each of the two.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base base5 gsplit gsplit6
BASE=/tmp/j_base@.abcache/base/python/sparse_mla/launch.py
timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=$BASE --variant base5=/tmp/j_base5@.abcache/base5/python/sparse_mla/launch.py \
  --variant gsplit=/tmp/j_gsplit --variant gsplit6=/tmp/j_gsplit6 --variant base2=$BASE --indices realistic-glm \
  --shape 4096,8192,16,576,2048 --shape 4096,8192,32,576,2048 --json $OUT/bisect-glm.json 2>&1 | tail -n 5

# Experiment 90 on the GPU machine (`bash benchmarks/experiments/split_rounds/device.sh`, from the
# repository root, carrying .whl and .abcache, after `make_trees` from hazards/ab_trees.sh): one build
# of the tree, timed through its own launch plan (base, twice) and through a copy of its launch.py
# whose long calls split in parts of 256 slots like short ones (anyrounds: the plan Experiment 90
# timed against the 8-round limit, at topk 512 too).
source benchmarks/experiments/hazards/ab_trees.sh
in_tree base python3 -m sparse_mla prebuild --d-qk 576 512 --topk 2048 512 -j 16 2>&1 | tail -n 1
P=/tmp/launch_any_rounds.py
sed 's/^_MIN_LONG_CALL_SPLIT_SLOTS = 512$/_MIN_LONG_CALL_SPLIT_SLOTS = 256/' .abcache/base/python/sparse_mla/launch.py > $P
grep -q '^_MIN_LONG_CALL_SPLIT_SLOTS = 256$' $P || { echo "launch.py has no _MIN_LONG_CALL_SPLIT_SLOTS"; exit 1; }
AB="timeout 280 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant anyrounds=/tmp/j_base@$P --variant base2=/tmp/j_base"
$AB --indices uniform --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 --shape 4096,32768,128,576,2048 \
  --shape 4096,131072,128,576,2048 --shape 4096,32768,64,576,2048 --shape 4096,8192,64,512,512 --shape 4096,32768,64,512,512 \
  --shape 1024,65536,128,576,2048 --shape 437,8192,64,576,2048 --json $OUT/split-rounds-ab-uniform.json 2>&1 | tail -n 11
$AB --indices realistic-glm --shape 4096,8192,64,576,2048 --shape 4096,8192,128,576,2048 --shape 4096,131072,128,576,2048 \
  --json $OUT/split-rounds-ab-glm.json 2>&1 | tail -n 5

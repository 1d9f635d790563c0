# Experiment 100: the fold built as a side pass after the last pair (fold, fold_serial.patch) against main (base),
# main timed twice; the token-group tests on the fold first. From the repository root on the GPU machine,
# carrying .whl and .abcache (README.md beside this says how the trees are made).
source benchmarks/experiments/hazards/ab_trees.sh
for n in base fold; do in_tree $n python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 8 > /tmp/pb_$n.txt 2>&1 & done
in_tree fold python3 -m sparse_mla prebuild --d-qk 576 --topk 64 100 512 4096 -j 4 > /tmp/pb_fold2.txt 2>&1 &
wait; tail -qn1 /tmp/pb_*.txt
in_tree fold timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_groups.py > $OUT/tests-fold.txt 2>&1; tail -n 3 $OUT/tests-fold.txt
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant fold=/tmp/j_fold --variant base2=/tmp/j_base"
timeout 200 $AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,131072,32,576,2048 \
  --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,131072,8,576,2048 \
  --shape 1024,8192,32,576,2048 --json $OUT/fold-glm.json 2>&1 | tail -n 8
timeout 60 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --json $OUT/fold-dsv4.json 2>&1 | tail -n 2

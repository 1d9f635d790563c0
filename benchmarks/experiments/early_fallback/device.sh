# Experiment 118: the pre-pass's early fallback (a group stops after its first two tokens where their
# estimate shows that its union clearly does not pay), against its parent (base), the parent timed
# twice: e118b decides between two loops of rounds (early_fallback_b.patch), e118c also defers token
# 2's slot loads past the decision (early_fallback_c.patch). From the repository root on the GPU
# machine, carrying .whl and .abcache (README.md beside this says how the trees are made).
source benchmarks/experiments/hazards/ab_trees.sh
in_tree base python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 1 > /tmp/pb_base.txt 2>&1 &
for v in e118b e118c; do
  in_tree $v python3 -m sparse_mla prebuild --d-qk 576 --topk 7 64 100 512 2048 4096 -j 6 > /tmp/pb_$v.txt 2>&1 &
  in_tree $v python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 2 > /tmp/pb_${v}_512.txt 2>&1 &
done
wait
tail -qn 1 /tmp/pb_base.txt /tmp/pb_e118b.txt /tmp/pb_e118c.txt /tmp/pb_e118b_512.txt /tmp/pb_e118c_512.txt
PRE="python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base e118b=/tmp/j_e118b e118c=/tmp/j_e118c base2=/tmp/j_base"
CASES=uniform:8192:16,uniform:8192:8,uniform:32768:16,uniform:131072:16,uniform:131072:8,realistic-glm:8192:16,realistic-glm:8192:8,realistic-glm:131072:16,realistic-glm:131072:8,realistic-dsv4:8192:16,realistic-dsv4:131072:16,realistic-dsv4:131072:8 \
  timeout 150 $PRE > $OUT/prepass-4096.txt 2>&1; tail -n 12 $OUT/prepass-4096.txt
S_Q=1024 CASES=uniform:8192:16,uniform:131072:8,realistic-glm:8192:8,realistic-glm:8192:16,realistic-dsv4:131072:8 \
  timeout 60 $PRE > $OUT/prepass-1024.txt 2>&1; tail -n 5 $OUT/prepass-1024.txt
AB="python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant e118b=/tmp/j_e118b --variant e118c=/tmp/j_e118c --variant base2=/tmp/j_base"
timeout 100 $AB --indices uniform --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 1024,131072,8,576,2048 --json $OUT/e118-uniform.json 2>&1 | tail -n 6
timeout 100 $AB --indices realistic-glm --shape 4096,8192,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 1024,8192,8,576,2048 --json $OUT/e118-glm.json 2>&1 | tail -n 6
timeout 80 $AB --indices realistic-dsv4 --shape 4096,131072,16,576,2048 --shape 4096,131072,8,576,2048 \
  --shape 1024,131072,8,576,2048 --json $OUT/e118-dsv4.json 2>&1 | tail -n 5
for v in e118b e118c; do
  in_tree $v timeout 150 python3 -m pytest -q tests/gpu/test_token_groups.py > $OUT/tests_token_groups_$v.log 2>&1
  tail -n 2 $OUT/tests_token_groups_$v.log
done

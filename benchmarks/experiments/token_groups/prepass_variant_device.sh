# A pre-pass change on the GPU machine (`bash prepass_variant_device.sh NAME`), from the repository
# root, carrying .abcache, after `make_trees NAME` (hazards/ab_trees.sh) here, HEAD the commit
# before the change and the working tree with it: the pre-pass of both side by
# side with their lists compared, whole calls, then the changed tree's tests/gpu. `CASES` (as
# prepass_ab.py takes them, pattern:s_kv:h_q,...) replaces the pre-pass's cases. Experiment 71 ran it
# as NAME=pp with indices_prefetch.patch, 72 as trim, 74 as full with its own CASES, 77 as mt.
V=${1:?give the variant a name}
source benchmarks/experiments/hazards/ab_trees.sh
ab_trees $V
CASES=${CASES:-realistic-glm:131072:8,realistic-dsv4:131072:8,realistic-glm:8192:8,realistic-glm:131072:16,realistic-glm:8192:16,realistic-glm:8192:32,uniform:131072:16,uniform:131072:8} \
  timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base $V=/tmp/j_$V base2=/tmp/j_base 2>&1 | tee $OUT/prepass_ab.txt | grep -v Warn
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant $V=/tmp/j_$V --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,8,576,2048 \
  --shape 4096,8192,32,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 5
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -n 3
(in_tree $V timeout 330 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_$V.txt 2>&1; tail -n 4 $OUT/tests_$V.txt)

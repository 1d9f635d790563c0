# word_map.patch and word_map_one_chunk.patch, each beside their base, on the GPU machine
# (`bash word_map_device.sh`, from the repository root, carrying .abcache). The trees, made here
# with HEAD the patches' base (../hazards/ab_trees.sh):
#   git apply benchmarks/experiments/token_groups/word_map.patch && make_trees word && git checkout include
#   git apply benchmarks/experiments/token_groups/word_map_one_chunk.patch && make_trees both && git checkout include
# The pre-pass of all three with their lists compared (the baseline twice), then whole calls. The
# faster tree's tests/gpu run in a call of their own: `ab_trees NAME`, then pytest through `in_tree NAME`.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base word both
CASES=realistic-glm:8192:32,realistic-glm:8192:16,realistic-glm:8192:8,uniform:8192:16,realistic-glm:32768:16,realistic-glm:131072:32,realistic-glm:131072:16,realistic-glm:131072:8,uniform:131072:16 \
  timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base word=/tmp/j_word both=/tmp/j_both base2=/tmp/j_base 2>&1 \
  | tee $OUT/word_map_prepass_ab.txt | grep -v Warn
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant word=/tmp/j_word --variant both=/tmp/j_both --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 4096,8192,8,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --json $OUT/word_map_ab_glm.json 2>&1 | tail -n 5
$AB --shape 4096,8192,16,576,2048 --json $OUT/word_map_ab_uniform.json 2>&1 | tail -n 2

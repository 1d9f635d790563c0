# Experiment 110 on uniform selections (the same change measured as Experiment 55 cost uniform
# pre-passes 1-3.6 us): main before it (7af2670, .abcache/base) against main with it (.abcache/la),
# the pre-pass alone, then whole calls. On the CPU host: `mkdir -p .abcache/base .abcache/la; git
# archive 7af2670 include python pyproject.toml | tar -x -C .abcache/base; git archive HEAD include
# python tests pyproject.toml | tar -x -C .abcache/la`; on the GPU machine, carrying .whl and .abcache.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base la
for s in 1024 4096; do
  S_Q=$s CASES=uniform:8192:8,uniform:8192:16,uniform:131072:8,uniform:131072:16,uniform:8192:32,realistic-glm:8192:16 \
    timeout 150 python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base la=/tmp/j_la \
    base2=/tmp/j_base 2>&1 | grep -v Warn | sed "s/^/s_q $s: /"
done
AB="$(ab_command la)"
$AB --shape 4096,8192,8,576,2048 --shape 4096,8192,16,576,2048 --shape 4096,131072,16,576,2048 \
  --shape 4096,131072,8,576,2048 --shape 1024,8192,16,576,2048 --shape 1024,131072,8,576,2048 \
  --json $OUT/ab_la_uniform.json 2>&1 | grep -v Warn | tail -8

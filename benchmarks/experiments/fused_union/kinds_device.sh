# Experiment 84, one resource at a time, on the GPU machine (`bash benchmarks/experiments/fused_union/kinds_device.sh`,
# from the repository root, carrying .whl and .abcache), after `make_trees k1 k2 k3 k4 k5` here with
# synthetic_build.patch applied and each tree's SYNTH_BUILD_KIND set to its number, SYNTH_BUILD_SLOTS 4
# (and .abcache/l4: kind 0, late, 4 slots); the grouped kernel's SASS of kinds 1 and 5 for its spills.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base l4 k1 k2 k3 k4 k5
for k in k1 k5; do so=$(find /tmp/j_$k -name "*.so" | head -1); cuobjdump -sass -fun '_ZN10sparse_mla4sm907prefill14prefill_kernelILi576ELi2048ELNS1_4TileE2EEEvNS_13PrefillParamsE' $so > $OUT/sass_grouped_$k.txt 2>&1; echo "$k STL $(grep -c STL $OUT/sass_grouped_$k.txt) LDL $(grep -c LDL $OUT/sass_grouped_$k.txt) lines $(wc -l < $OUT/sass_grouped_$k.txt)"; done
AB="timeout 200 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base"
for v in l4 k1 k2 k3 k4 k5; do AB="$AB --variant $v=/tmp/j_$v"; done
$AB --variant base2=/tmp/j_base --indices realistic-glm --shape 4096,8192,32,576,2048 --shape 1024,8192,32,576,2048 --shape 4096,8192,8,576,2048 \
  --json $OUT/synthetic-build-ab-glm-kinds.json 2>&1 | tail -n 5

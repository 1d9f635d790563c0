# Experiment 85: the wide and 32-head kernels' SASS of the base and of w32 (device.sh's trees), for Experiment 85's why.
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base w32
for v in base w32; do so=$(find /tmp/j_$v -name "*.so" | head -1)
  for k in 0 1; do cuobjdump -sass -fun "_ZN10sparse_mla4sm907prefill14prefill_kernelILi576ELi2048ELNS1_4TileE${k}EEEvNS_13PrefillParamsE" $so > $OUT/sass_tile${k}_$v.txt 2>&1; done
done
ls -la $OUT

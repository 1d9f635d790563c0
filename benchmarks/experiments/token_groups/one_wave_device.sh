# Experiment 82 on the GPU machine (`bash one_wave_device.sh`), from the repository root, carrying
# .abcache, after `make_trees wave` (hazards/ab_trees.sh) here, HEAD the commit before the change and
# the working tree with it: whole calls side by side where the pre-pass has at most one group an SM
# (and a control with more), then the changed tree's tests/gpu.
source benchmarks/experiments/hazards/ab_trees.sh
in_tree wave python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 16 > /tmp/pb_wave.txt 2>&1 &
in_tree base python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 4 > /tmp/pb_base.txt 2>&1 &
wait
tail -n 1 /tmp/pb_base.txt /tmp/pb_wave.txt
AB="timeout 120 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant wave=/tmp/j_wave --variant base2=/tmp/j_base"
$AB --indices realistic-glm --shape 1024,8192,8,576,2048 --shape 1024,32768,8,576,2048 --shape 1024,8192,12,576,2048 \
  --shape 512,8192,16,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -n 7
$AB --indices uniform --shape 1024,8192,8,576,2048 --json $OUT/ab_uniform.json 2>&1 | tail -n 2
in_tree wave python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 16 | tail -n 1
(in_tree wave timeout 330 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_wave.txt 2>&1; tail -n 4 $OUT/tests_wave.txt)

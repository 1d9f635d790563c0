# empty_last_block_569b314.patch and each of its halves beside their base, the baseline twice
# (`bash device_parts.sh` on the GPU machine, carrying .abcache): on full rows and where units end
# early. The trees, made here with `make_trees` (../hazards/ab_trees.sh) from working trees holding
# the patch's consumer.cuh, kernel.cuh and scheduler.cuh (cons), its producer.cuh and scheduler.cuh
# (prod) and all of it (half).
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base cons prod half
AB="timeout 150 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base --variant cons=/tmp/j_cons --variant prod=/tmp/j_prod --variant half=/tmp/j_half --variant base2=/tmp/j_base"
$AB --shape 4096,131072,64,576,2048 --shape 437,8192,64,576,2048 --shape 4096,8192,128,576,2048 --json $OUT/parts_uniform.json 2>&1 | tail -n 4
$AB --indices realistic-glm --shape 4096,8192,32,576,2048 --json $OUT/parts_glm.json 2>&1 | tail -n 2
$AB --topk-length random --shape 4096,32768,64,576,2048 --json $OUT/parts_random_lengths.json 2>&1 | tail -n 2

# Experiment 124, third part: the wide tile early against main on short calls, by three methods: ab.py
# with one set of outputs for every variant, ab.py as before (each variant its own outputs), and ncu's
# kernel durations (caches flushed before each of 10 launches). Each build under two names. Same carry
# and trees as ncu_device.sh.
source .whl/prelude.sh >/dev/null 2>&1
source benchmarks/experiments/hazards/ab_trees.sh
build_2048 base early
AB="timeout 240 python3 benchmarks/experiments/hazards/ab.py --iters 60 --indices uniform --variant base=/tmp/j_base --variant early=/tmp/j_early --variant base2=/tmp/j_base --variant early2=/tmp/j_early"
SHORT="--shape 132,8192,64,576,2048 --shape 264,8192,64,576,2048 --shape 437,8192,64,576,2048 --shape 600,8192,64,576,2048"
$AB --shared-outputs $SHORT --shape 4096,8192,64,576,2048 --shape 4096,32768,128,576,2048 --json $OUT/shared.json 2>&1 | grep -v Warn | tail -n 7
$AB $SHORT --json $OUT/own.json 2>&1 | grep -v Warn | tail -n 5
for s_q in 132 437; do
  for v in base early; do
    in_tree $v timeout 100 ncu --clock-control none -k regex:prefill_kernel --launch-skip 2 --launch-count 10 \
      --metrics gpu__time_duration.sum --csv python3 $AB_ROOT/benchmarks/experiments/early_q_empty/wide_once.py $s_q 64 12 \
      2>/dev/null | grep gpu__time_duration > $OUT/ncu_${v}_$s_q.csv
    python3 -c "import csv,sys,statistics as st; v=[float(r[-1].replace(',','')) for r in csv.reader(open('$OUT/ncu_${v}_$s_q.csv'))]; print('$v', $s_q, 'ncu median', st.median(v), 'min', min(v), 'n', len(v))"
  done
done

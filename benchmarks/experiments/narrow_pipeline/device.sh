#!/usr/bin/env bash
# On the GPU host, from the repository root, with prepare.sh's DIR carried. Two steps, one device
# call each (each under 10 minutes; a step builds what it needs):
#   device.sh DIR time   the narrow tile alone side by side (main, pipeline, landed, both zero-filled
#                        probes, main again for the noise floor), token groups off, then whole calls on
#                        realistic-dsv4 (whose fallback tokens run the narrow tile), outputs compared
#                        bitwise with main's
#   device.sh DIR test   tests/gpu of the patched tree (its sanitizer case `narrow` included)
# Writes under $OUT (or ./narrow_pipeline_out).
set -uo pipefail
dir=$(cd "${1:?usage: device.sh DIR time|test}" && pwd) step=${2:?usage: device.sh DIR time|test}
out=${OUT:-narrow_pipeline_out}; mkdir -p "$out"
export SPARSE_MLA_COMMIT=$(cat "$dir/commit")
build() {  # tree, then prebuild's arguments; the cache is /tmp/nrw_<tree>
  local tree=$1; shift
  (cd "$dir/$tree" && PYTHONPATH="$dir/$tree/python${PYTHONPATH:+:$PYTHONPATH}" SPARSE_MLA_JIT_CACHE_DIR=/tmp/nrw_$tree \
     python3 -m sparse_mla prebuild "$@" > "/tmp/pb-$tree.txt" 2>&1; echo "$tree: rc $? $(tail -1 /tmp/pb-$tree.txt)")
}
case $step in
time)
  for tree in main pipeline landed zf zfp; do build $tree --d-qk 576 --topk 2048 -j 3 & done; wait
  ab=benchmarks/experiments/hazards/ab.py
  shapes=""
  for shape in 4096,8192,8 4096,8192,16 4096,8192,32 4096,8192,64 4096,131072,16 1024,8192,16; do shapes+=" --shape $shape,576,2048"; done
  timeout 300 python3 $ab --iters 30 $shapes --json "$out/ab-narrow-uniform.json" \
    --variant main=/tmp/nrw_main:never --variant pipeline=/tmp/nrw_pipeline:never --variant landed=/tmp/nrw_landed:never \
    --variant zf=/tmp/nrw_zf:never --variant zfp=/tmp/nrw_zfp:never --variant main2=/tmp/nrw_main:never 2>/dev/null
  timeout 200 python3 $ab --iters 20 --indices realistic-dsv4 --json "$out/ab-auto-dsv4.json" \
    --shape 4096,131072,8,576,2048 --shape 4096,131072,16,576,2048 --shape 4096,8192,16,576,2048 \
    --variant main=/tmp/nrw_main --variant pipeline=/tmp/nrw_pipeline --variant landed=/tmp/nrw_landed --variant main2=/tmp/nrw_main 2>/dev/null
  ;;
test)
  build pipeline --d-qk 576 --topk 1 7 64 100 512 2048 -j 8
  build pipeline --d-qk 512 --topk 64 512 -j 2
  (cd "$dir/pipeline" && PYTHONPATH="$dir/pipeline/python${PYTHONPATH:+:$PYTHONPATH}" SPARSE_MLA_JIT_CACHE_DIR=/tmp/nrw_pipeline \
     timeout 480 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > "$out/gpu.txt" 2>&1
   echo "tests/gpu on the patch: rc $? $(tail -1 "$out/gpu.txt")"); grep -E "^FAILED|^E  " "$out/gpu.txt" | head -12
  ;;
*) echo "step is time or test"; exit 2 ;;
esac

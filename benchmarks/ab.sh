#!/usr/bin/env bash
# A/B of kernel builds: the working tree's change against HEAD, built side by side and timed by ab.py.
# Run from the repository root.
#
# Here, before the GPU call:
#   benchmarks/ab.sh trees NAME...   .abcache/base from HEAD; .abcache/NAME from the working tree
#                                    (include, python, tests). For several variants, edit each
#                                    .abcache/NAME afterwards, or apply a change, run `trees`, revert.
# On the GPU machine (carry .abcache; python3 must import torch and tvm-ffi):
#   benchmarks/ab.sh build [--tests] NAME...
#                  builds base and each NAME at d_qk 576 / topk 2048, side by side (--tests: each NAME
#                  also at every key tests/gpu uses), into $AB_CACHE/<name> (default /tmp/ab)
#   benchmarks/ab.sh time NAME... [-- AB_ARGS...]
#                  ab.py on base, each NAME and base again as base2 (the noise floor), with AB_ARGS
#                  (--indices, --shape, --iters, --incumbent, --json $OUT/x.json ...)
#   benchmarks/ab.sh tests NAME [PYTEST_ARGS...]   NAME's tests/gpu, with its package and its cache
#   benchmarks/ab.sh in NAME CMD...                CMD inside .abcache/NAME with its package and cache
#
# A typical device command:
#   benchmarks/ab.sh build new && benchmarks/ab.sh time new -- --indices realistic-glm \
#     --shape 4096,8192,16,576,2048 --shape 4096,131072,8,576,2048 --json $OUT/glm.json \
#     && benchmarks/ab.sh tests new -x
set -euo pipefail

ROOT=$PWD
TREES=$ROOT/.abcache
CACHE=${AB_CACHE:-/tmp/ab}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

in_tree() {
  local name=$1
  shift
  [ -d "$TREES/$name" ] || { echo "ab.sh: no tree $TREES/$name (run \`benchmarks/ab.sh trees $name\` first)" >&2; exit 1; }
  (cd "$TREES/$name" && PYTHONPATH="$TREES/$name/python${PYTHONPATH:+:$PYTHONPATH}" \
    SPARSE_MLA_JIT_CACHE_DIR="$CACHE/$name" "$@")
}

make_trees() {
  local name
  rm -rf "$TREES/base" && mkdir -p "$TREES/base"
  git archive HEAD include python pyproject.toml | tar -x -C "$TREES/base"
  for name in "$@"; do
    [ "$name" != base ] || { echo "ab.sh: 'base' is HEAD's tree; name the variant otherwise" >&2; exit 2; }
    rm -rf "$TREES/$name" && mkdir -p "$TREES/$name"
    tar -c include python tests pyproject.toml | tar -x -C "$TREES/$name"
  done
}

build() {
  local tests=0 name
  if [ "${1:-}" = --tests ]; then tests=1; shift; fi
  [ $# -gt 0 ] || usage
  local names=(base "$@")
  local jobs=$(( $(nproc) / ${#names[@]} ))
  [ "$jobs" -ge 1 ] || jobs=1
  for name in "${names[@]}"; do
    mkdir -p "$CACHE"
    if [ "$tests" = 1 ] && [ "$name" != base ]; then
      { in_tree "$name" python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j "$jobs" &&
        in_tree "$name" python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j "$jobs"; } > "$CACHE/$name.log" 2>&1 &
    else
      in_tree "$name" python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j "$jobs" > "$CACHE/$name.log" 2>&1 &
    fi
  done
  local failed=0
  for name in "${names[@]}"; do
    wait -n || failed=1
  done
  for name in "${names[@]}"; do echo "$name: $(tail -n 1 "$CACHE/$name.log")"; done
  [ "$failed" = 0 ] || { echo "ab.sh: a build failed (logs: $CACHE/*.log)" >&2; exit 1; }
}

time_variants() {
  local names=() name
  while [ $# -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
  [ "${1:-}" != -- ] || shift
  [ ${#names[@]} -gt 0 ] || usage
  local variants=(--variant "base=$CACHE/base")
  for name in "${names[@]}"; do variants+=(--variant "$name=$CACHE/$name"); done
  variants+=(--variant "base2=$CACHE/base")
  PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$ROOT/benchmarks/ab.py" "${variants[@]}" "$@"
}

[ $# -gt 0 ] || usage
command=$1
shift
case "$command" in
  trees) [ $# -gt 0 ] || usage; make_trees "$@" ;;
  build) build "$@" ;;
  time) time_variants "$@" ;;
  tests) [ $# -gt 0 ] || usage; name=$1; shift; in_tree "$name" python3 -m pytest tests/gpu -q -rs -p no:cacheprovider "$@" ;;
  in) [ $# -gt 1 ] || usage; in_tree "$@" ;;
  *) usage ;;
esac

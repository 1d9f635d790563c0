# Sourced by the experiments' device scripts, on the GPU machine, from the repository root, with
# .abcache carried: .abcache/base holds the baseline's source tree, .abcache/NAME the changed one.
# Here, before the call, `source benchmarks/experiments/hazards/ab_trees.sh && make_trees NAME...`
# makes them.
#   make_trees NAME...   .abcache/base from HEAD, each .abcache/NAME from the working tree (tests too)
#   in_tree NAME CMD...  runs CMD inside .abcache/NAME with that tree's package and kernel cache
#                        (/tmp/j_NAME)
#   ab_trees NAME        builds the baseline at topk 2048 and NAME at every key its tests use, side by side
#   build_2048 NAME...   builds each NAME (base included, if named) at topk 2048 only, side by side
#   ab_command NAME...   prints the hazards/ab.py command that times the base, each NAME and the base
#                        again side by side (20 calls each), from the caches build_2048 filled
AB_ROOT=$PWD
make_trees() {
  local name
  rm -rf "$AB_ROOT/.abcache/base" && mkdir -p "$AB_ROOT/.abcache/base"
  git archive HEAD include python pyproject.toml | tar -x -C "$AB_ROOT/.abcache/base"
  for name in "$@"; do
    rm -rf "$AB_ROOT/.abcache/$name" && mkdir -p "$AB_ROOT/.abcache/$name"
    tar -c include python tests pyproject.toml | tar -x -C "$AB_ROOT/.abcache/$name"
  done
}
in_tree() {
  local name=$1
  shift
  (cd "$AB_ROOT/.abcache/$name" && PYTHONPATH="$AB_ROOT/.abcache/$name/python:/tmp/site" SPARSE_MLA_JIT_CACHE_DIR="/tmp/j_$name" "$@")
}
ab_trees() {
  in_tree base python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 8 > /tmp/pb_base.txt 2>&1 &
  in_tree "$1" python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 8 > "/tmp/pb_$1.txt" 2>&1 &
  wait
  tail -n 1 /tmp/pb_base.txt "/tmp/pb_$1.txt"
  in_tree "$1" python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 8 | tail -n 1
}
build_2048() {
  local name
  for name in "$@"; do
    in_tree "$name" python3 -m sparse_mla prebuild --d-qk 576 --topk 2048 -j 5 > "/tmp/pb_$name.txt" 2>&1 &
  done
  wait
  for name in "$@"; do tail -n 1 "/tmp/pb_$name.txt"; done
}
ab_command() {
  local name command="timeout 280 python3 benchmarks/experiments/hazards/ab.py --iters 20 --variant base=/tmp/j_base"
  for name in "$@"; do command="$command --variant $name=/tmp/j_$name"; done
  echo "$command --variant base2=/tmp/j_base"
}

#!/usr/bin/env bash
# Prebuild on a host with nvcc (no GPU needed), then run on an offline GPU node that never compiles.
#
#   bash examples/offline_prebuild.sh /shared/sparse_mla_cache
#
# The cache entries are keyed by a digest of the sources and toolchain versions, not by any path, so
# the directory can be copied anywhere; the GPU node needs the same sparse_mla version.
set -euo pipefail
cache_dir=${1:-$PWD/jit_cache}

# 1. On the build host: compile the kernels the model uses (DeepSeek-V3.2: d_qk 576, topk 2048).
python -m sparse_mla prebuild --d-qk 576 --topk 2048 --cache-dir "$cache_dir"
python -m sparse_mla list --cache-dir "$cache_dir"

# 2. On the GPU node (after copying $cache_dir there): load only, never compile. A kernel missing from
#    the cache raises JITDisabledError naming the prebuild command instead of starting nvcc.
export SPARSE_MLA_JIT_CACHE_DIR="$cache_dir" SPARSE_MLA_DISABLE_JIT=1
python -c "import sparse_mla; sparse_mla.warmup(d_qk=576, topk=2048); print('loaded from', '$cache_dir')"

# Two source trees for device.sh from the repository's HEAD: the baseline, and HEAD with
# balanced_when_idle.patch (run from the repository root, on the commit the patch is against).
set -e
rm -rf .abcache/base .abcache/bal && mkdir -p .abcache/base .abcache/bal
git archive HEAD include python pyproject.toml | tar -x -C .abcache/base
git archive HEAD include python tests pyproject.toml | tar -x -C .abcache/bal
patch -p1 -d .abcache/bal < benchmarks/experiments/grouped_stream_k/balanced_when_idle.patch

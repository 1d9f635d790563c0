# Two source trees for device.sh, from the repository's HEAD (the baseline) and HEAD with the patch.
set -e
rm -rf .abcache/hd .abcache/n8 && mkdir -p .abcache/hd .abcache/n8
git archive HEAD include python pyproject.toml | tar -x -C .abcache/hd
git archive HEAD include python pyproject.toml | tar -x -C .abcache/n8
patch -p1 -d .abcache/n8 < benchmarks/experiments/narrow8_tile/narrow8_tile.patch

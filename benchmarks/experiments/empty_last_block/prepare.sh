# Two source trees for device.sh (run from the repository root): the committed HEAD, and the
# working tree with its change (Experiment 66 of benchmarks/notes/2026-12-01.md).
set -e
rm -rf .abcache/base .abcache/e66 && mkdir -p .abcache/base .abcache/e66
git archive HEAD include python pyproject.toml | tar -x -C .abcache/base
tar -c include python tests pyproject.toml | tar -x -C .abcache/e66

#!/usr/bin/env bash
# Source trees for device.sh, under DIR (a folder git ignores; carry it to the GPU host):
#   main      HEAD's include/, python/, tests/ and pyproject.toml
#   pipeline  main + narrow_pipeline.patch (the copies arrive by themselves, consumer-side fence)
#   landed    main + narrow_pipeline_landed.patch (the producer-side handoff, one pair ahead)
#   zf, zfp   main and pipeline with every copy of the narrow tile zero-filled (zero_fill_probe.patch)
set -euo pipefail
dir=${1:?usage: prepare.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
for tree in main pipeline landed zf zfp; do
  rm -rf "$dir/$tree" && mkdir -p "$dir/$tree"
  git -C "$root" archive HEAD include python tests pyproject.toml | tar -x -C "$dir/$tree"
done
# patch(1), not git apply: inside a checkout's ignored folder, git apply skips every path silently.
apply() { patch -s -p1 --no-backup-if-mismatch -d "$dir/$1" < "$here/$2"; }
apply pipeline narrow_pipeline.patch
apply landed narrow_pipeline_landed.patch
apply zfp narrow_pipeline.patch
apply zf zero_fill_probe.patch
apply zfp zero_fill_probe.patch
git -C "$root" rev-parse --short HEAD > "$dir/commit"
echo "trees in $dir: $(ls "$dir" | tr '\n' ' ')"

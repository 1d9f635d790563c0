"""The token groups' pre-pass of several builds, side by side, and whether their lists agree.

Each variant is ``NAME=CACHE_ROOT`` of a build made with ``python -m sparse_mla prebuild --d-qk 576
--topk 2048`` from one source tree (``experiments/hazards/ab.py``'s variants). At 4096 rows and topk
2048, on realistic and uniform indices at s_kv 32K and 128K, every build's pre-pass is timed
interleaved with the others (``interleaved_median_ms``), and each group's length, and for every 61st
group its list and masks, are compared with the first build's bitwise, at the package's union
threshold (Experiment 43's run used 0.7 at 32K and 0.55 at 128K, the thresholds of the time). The same
root under two names times one build twice: the noise floor. (Experiment 43 of ``benchmarks/notes/2026-12-01.md``.)

    python benchmarks/experiments/token_groups/prepass_ab.py hash=/tmp/jit_old map=/tmp/jit_new hash2=/tmp/jit_old

``CASES=realistic-glm:131072:8,uniform:8192:16`` (pattern:s_kv:h_q, comma-separated) replaces the
cases below; ``S_Q=1024`` times calls of 1024 rows instead of 4096.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "hazards"))
from ab import load_variant  # noqa: E402
from bench import pattern_indices  # noqa: E402  (ab puts benchmarks/ on the path)

from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION  # noqa: E402
from sparse_mla.launch import group_size, max_union_ratio, token_group_lists  # noqa: E402
from sparse_mla.testing import make_inputs, interleaved_median_ms  # noqa: E402

S_Q, TOPK = int(os.environ.get("S_Q", 4096)), 2048
CASES = [("realistic-glm", 8192, 8), ("realistic-glm", 8192, 16), ("realistic-glm", 8192, 32),
         ("realistic-glm-sorted", 8192, 16), ("realistic-dsv4", 8192, 16), ("uniform", 8192, 16),
         ("realistic-glm", 32768, 8), ("realistic-glm", 32768, 16), ("realistic-glm", 32768, 32),
         ("uniform", 32768, 16), ("realistic-glm", 131072, 16), ("realistic-dsv4", 131072, 16),
         ("realistic-dsv4", 131072, 32), ("uniform", 131072, 8), ("uniform", 131072, 32)]


def same_lists(a, b) -> bool:
    if not torch.equal(a[2], b[2]):
        return False
    for k in range(0, a[2].numel(), 61):
        n = int(a[2][k])
        blocks = (n + 127) // 128 * 2
        if n >= 0 and not (torch.equal(a[0][k, :n], b[0][k, :n]) and torch.equal(a[1][k, :blocks], b[1][k, :blocks])):
            return False
    return True


def main() -> None:
    variants = [load_variant(spec) for spec in sys.argv[1:]]
    cases = CASES
    if os.environ.get("CASES"):
        cases = [(p, int(s_kv), int(h_q)) for p, s_kv, h_q in (c.split(":") for c in os.environ["CASES"].split(","))]
    for pattern, s_kv, h_q in cases:
        indices = pattern_indices(pattern, S_Q, s_kv, TOPK, 0, make_inputs(S_Q, s_kv, h_q, 576, TOPK, seed=0)["indices"])
        group = group_size(h_q, TOPK)
        calls, lists = {}, {}
        for name, modules, _, _ in variants:  # (name, modules, mode, launch plan)
            lists[name] = token_group_lists(indices.device, S_Q, group, TOPK)
            for tensor in lists[name]:
                tensor.fill_(-7)
            pre_pass = getattr(modules[(576, TOPK)], TOKEN_GROUPS_FUNCTION)
            # The unit lists' counts are zeroed before every run (the pre-pass appends to them).
            calls[name] = (lambda f=pre_pass, out=lists[name]: (out[3][:2].zero_(),
                                                                f(indices, None, s_kv, h_q, group, max_union_ratio(h_q), *out)))
        ms = interleaved_median_ms(calls, iters=30)
        first = lists[variants[0][0]]
        paying = (first[2] >= 0).float().mean().item()
        equal = all(same_lists(first, other) for other in lists.values())
        print(f"{pattern:15s} s_kv {s_kv:6d} h_q {h_q:2d} (paying {paying:.2f}): "
              + "  ".join(f"{name} {t * 1000:.1f} us" for name, t in ms.items()) + f"  lists equal {equal}", flush=True)


if __name__ == "__main__":
    main()

"""Token-grouped calls of two kinds of build side by side: those from before the unit lists (c1e0182 and
earlier: three token-group lists, each launch walking every unit and skipping the other's) and those
with them (1cc0675 on: a fourth list, `group_units`, whose two counts must be zero before each
pre-pass, and each launch walking its own list).

Each variant is ``NAME=CACHE_ROOT:KIND`` (KIND ``main`` or ``lists``) of a build made with ``python -m
sparse_mla prebuild --d-qk 576 --topk 2048`` from one source tree. Per index pattern and h_q (8, 16,
32; 64 for the per-head unit: the wide tile, its items whole), every variant's whole call (the
pre-pass at union threshold RATIO, then the grouped and the narrow launch, its lists allocated per
call as the package does; each build called with its own argument list) is timed interleaved with
the others (``interleaved_median_ms``), and the outputs are compared bitwise with the first variant's. The same root under two names times one
build twice: the noise floor. RATIO below the package's threshold (e.g. 0.65 on realistic-dsv4 at
h_q 32) makes the mixed calls, in which only part of the groups pay, that the unit lists are for.

    PATTERNS=realistic-glm,realistic-dsv4,uniform S_KV=32768 RATIO=0.75 \\
        python benchmarks/experiments/token_groups/ab_unit_lists.py main=/tmp/jit_main:main lists=/tmp/jit_lists:lists
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
import tvm_ffi

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/bench.py: no package
from bench import pattern_indices  # noqa: E402

from sparse_mla.jit import ENTRY_FUNCTION  # noqa: E402
from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION  # noqa: E402
from sparse_mla.launch import MAX_UNION_RATIO, group_size, token_group_lists  # noqa: E402
from sparse_mla.testing import interleaved_median_ms, make_inputs, poisoned_outputs  # noqa: E402

S_Q, TOPK, D_QK = 4096, 2048, 576


def lists_of(kind: str, device: torch.device, group: int) -> tuple[torch.Tensor, ...]:
    """The token-group lists a build of this kind takes, allocated as its package does per call."""
    lists = token_group_lists(device, S_Q, group, TOPK)  # with the unit lists (group_units) last
    return lists if kind == "lists" else lists[:3]


def wide_call(module, kind: str, inputs: dict, outputs: dict):
    """The wide tile at h_q 64, every item whole (no tail split), no token groups."""
    entry = getattr(module, ENTRY_FUNCTION)
    no_groups = (None,) * (4 if kind == "lists" else 3)
    return lambda: entry(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"].reshape(1),
                         inputs["kv_scale"].reshape(1), None, None, outputs["out"], outputs["max_logits"],
                         outputs["lse"], inputs["sm_scale"], S_Q, 1, None, None, 1, *no_groups, False)


def grouped_call(module, kind: str, inputs: dict, outputs: dict, s_kv: int, h_q: int, ratio: float):
    group = group_size(h_q, TOPK)
    pre_pass, entry = getattr(module, TOKEN_GROUPS_FUNCTION), getattr(module, ENTRY_FUNCTION)

    def call():
        lists = lists_of(kind, inputs["q"].device, group)
        pre_pass(inputs["indices"], None, s_kv, h_q, group, ratio, *lists)
        for grouped in (True, False):
            entry(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"].reshape(1),
                  inputs["kv_scale"].reshape(1), None, None, outputs["out"], outputs["max_logits"],
                  outputs["lse"], inputs["sm_scale"], S_Q, 1, None, None, group, *lists, grouped)
    return call


def main() -> None:
    s_kv = int(os.environ.get("S_KV", "32768"))
    ratio = float(os.environ.get("RATIO", str(MAX_UNION_RATIO)))
    variants = []
    for spec in sys.argv[1:]:
        name, _, rest = spec.partition("=")
        root, _, kind = rest.partition(":")
        assert kind in ("main", "lists"), f"{spec}: KIND is main or lists"
        so = next(pathlib.Path(root).glob(f"sm90a/sparse_mla_prefill_dqk{D_QK}_topk{TOPK}_sm90a/*/*.so"))
        variants.append((name, tvm_ffi.load_module(str(so)), kind))
    for pattern in os.environ.get("PATTERNS", "realistic-glm,realistic-dsv4,uniform").split(","):
        wide: dict[str, float] = {}
        for h_q in (64, 8, 16, 32):
            inputs = make_inputs(S_Q, s_kv, h_q, D_QK, TOPK, seed=0)
            inputs["indices"] = pattern_indices(pattern, S_Q, s_kv, TOPK, 0, inputs["indices"])
            calls, outs = {}, {}
            for name, module, kind in variants:
                outputs = outs[name] = poisoned_outputs(S_Q, h_q)
                if h_q == 64:
                    calls[name] = wide_call(module, kind, inputs, outputs)
                else:
                    calls[name] = grouped_call(module, kind, inputs, outputs, s_kv, h_q, ratio)
            ms = interleaved_median_ms(calls, iters=15)
            first = outs[variants[0][0]]
            same = all(torch.equal(first["out"], o["out"]) and torch.equal(first["lse"], o["lse"])
                       for o in outs.values())
            if h_q == 64:
                wide = ms
            cells = "  ".join(f"{name} {t:.3f} ms ({t / wide[name] * 64 / h_q:.2f}x)" for name, t in ms.items())
            print(f"{pattern:14s} s_kv {s_kv} h_q {h_q:2d} ratio {ratio}: {cells}  outputs equal {same}", flush=True)


if __name__ == "__main__":
    main()

"""Realistic indexer selections and the overlap statistics that describe them.

Uniform random indices (`random_indices`) share almost no rows between neighbouring query tokens; real
indexer output does. `realistic_indices` reproduces both the retention and the union growth of real
selections with a latent score per causal candidate row:

    score[i, r] = importance[r] + HUB_BOOST * [r is a hub] + drift_i[r] + noise * eps_i[r]

where importance and eps are standard normal, and drift_i is a stationary AR(1) process over query
tokens: ``drift_i = rho * drift_{i-1} + sqrt(1 - rho^2) * standard normal``. Each query keeps its
top-k candidates. `PRESETS` holds the settings matched to published captures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from sparse_mla.testing.inputs import _CORNER_SHARE, _generator, _random_mask

__all__ = [
    "PRESETS",
    "IndexOverlap",
    "index_overlap_stats",
    "realistic_indices",
    "shared_neighbour_indices",
    "with_duplicated_groups",
    "with_shared_neighbours",
]

HUB_BOOST = 4.0  # added to the score of hub rows: they are selected by (nearly) every query
_CHUNK_ELEMENTS = 1 << 24  # scores materialized at once (64 MiB of float32)

# Named settings for benchmarks (realistic index patterns): GLM-style selections with
# retention ~0.95-0.99, DeepSeek-V4-style ones where per-query noise makes rows flicker near the cut-off.
PRESETS = {
    "realistic-glm": {"rho": 0.999, "noise": 0.0, "hubs": 16},
    "realistic-dsv4": {"rho": 0.99, "noise": 0.4, "hubs": 16},
}


@dataclass(frozen=True)
class IndexOverlap:
    """How much neighbouring query rows share: see `index_overlap_stats`."""

    retention: float  # mean share of a row's selection that the previous row also selected
    union4: float  # mean size of the union of 4 adjacent rows, over the mean size of one row


def realistic_indices(
    s_q: int,
    s_kv: int,
    topk: int,
    *,
    rho: float,
    noise: float,
    hubs: int,
    seed: Optional[int] = None,
    device: str | torch.device = "cuda",
) -> torch.Tensor:
    """``[s_q, 1, topk]`` int32 causal selections with realistic overlap between neighbouring rows.

    Query i is token ``s_kv - s_q + i`` of an ``s_kv``-long context and sees KV rows
    ``[0, s_kv - s_q + i]``; it selects its ``topk`` best-scoring visible rows (module docstring),
    in descending score order, padded with -1 when fewer rows are visible. ``rho`` near 1 makes
    selections drift slowly, ``noise`` makes them flicker, ``hubs`` rows are boosted for everybody.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    generator = _generator(seed, device)
    importance = torch.randn(s_kv, device=device, generator=generator)
    hub_rows = torch.randperm(s_kv, device=device, generator=generator)[:hubs]
    importance[hub_rows] += HUB_BOOST
    drift = torch.randn(s_kv, device=device, generator=generator)
    innovation = math.sqrt(1.0 - rho * rho)
    rows = torch.arange(s_kv, device=device)
    k = min(topk, s_kv)

    indices = torch.full((s_q, topk), -1, dtype=torch.int32, device=device)
    chunk = max(1, _CHUNK_ELEMENTS // s_kv)
    for start in range(0, s_q, chunk):
        stop = min(start + chunk, s_q)
        scores = torch.empty(stop - start, s_kv, device=device)
        for i in range(stop - start):
            drift = rho * drift + innovation * torch.randn(s_kv, device=device, generator=generator)
            scores[i] = drift
        scores += importance
        if noise:
            scores += noise * torch.randn(stop - start, s_kv, device=device, generator=generator)
        last_visible = s_kv - s_q + torch.arange(start, stop, device=device)
        scores.masked_fill_(rows > last_visible.unsqueeze(1), -math.inf)
        best = scores.topk(k, dim=1)
        indices[start:stop, :k] = torch.where(torch.isfinite(best.values), best.indices, -1).int()
    return indices.unsqueeze(1)


def shared_neighbour_indices(
    s_q: int,
    s_kv: int,
    topk: int,
    *,
    group: int,
    shared: float,
    seed: Optional[int] = None,
    device: str | torch.device = "cuda",
) -> torch.Tensor:
    """``[s_q, 1, topk]`` int32 selections whose neighbours overlap by construction: in each run of
    ``group`` adjacent rows (from row 0), every row selects the run's ``round(shared * topk)`` common
    rows and ``topk`` minus that many rows of its own, all distinct within the row and in the row's own
    random order. Fast to draw for small shapes (tests); ``realistic_indices`` is the realistic pattern."""
    if not 0.0 <= shared <= 1.0 or topk > s_kv:
        raise ValueError(f"shared must be in [0, 1] and topk <= s_kv, got shared {shared}, topk {topk}, s_kv {s_kv}")
    generator = _generator(seed, device)
    common = round(shared * topk)
    indices = torch.empty(s_q, topk, dtype=torch.int32, device=device)
    for start in range(0, s_q, group):
        pool = torch.randperm(s_kv, device=device, generator=generator)
        for row in range(start, min(start + group, s_q)):
            rest = pool[common:][torch.randperm(s_kv - common, device=device, generator=generator)[: topk - common]]
            chosen = torch.cat([pool[:common], rest])
            indices[row] = chosen[torch.randperm(topk, device=device, generator=generator)].int()
    return indices.unsqueeze(1)


def with_shared_neighbours(inputs: dict, group: int, shared: float, seed: Optional[int] = None) -> dict:
    """``make_inputs``' arguments with indices whose runs of ``group`` adjacent rows share ``shared`` of
    their slots (`shared_neighbour_indices`). Only the distinct valid slots are replaced: invalid,
    hostile and duplicated slots stay where make_inputs put them, and the new rows hold no NaN
    (``nan_kv_rows`` puts NaN behind invalid slots only)."""
    indices, kv = inputs["indices"], inputs["kv"]
    s_q, _, topk = indices.shape
    clean = torch.nonzero(~kv.float().isnan().any(dim=-1).any(dim=-1)).flatten().int()
    drawn = shared_neighbour_indices(s_q, clean.numel(), topk, group=group, shared=shared, seed=seed,
                                     device=indices.device)
    replace = torch.zeros_like(indices, dtype=torch.bool)
    for row in range(s_q):
        values = indices[row, 0]
        _, inverse, counts = torch.unique(values, return_inverse=True, return_counts=True)
        replace[row, 0] = (counts[inverse] == 1) & (values >= 0) & (values < kv.shape[0])
    result = dict(inputs)
    result["indices"] = torch.where(replace, clean[drawn.long()], indices).contiguous()
    return result


def with_duplicated_groups(inputs: dict, group: int, every: int = 4, seed: Optional[int] = None) -> dict:
    """``make_inputs``' arguments in which the rows of every ``every``-th run of ``group`` adjacent rows
    (runs 0, every, 2 * every, ...) have their slots duplicated as ``make_inputs(duplicates=True)``
    does (a quarter of them copied from other slots of the same row): token groups in which a token
    selects a row more than once, which run token by token, among groups that do not."""
    indices = inputs["indices"][:, 0]
    s_q, topk = indices.shape
    generator = _generator(seed, indices.device)
    source = torch.randint(0, topk, (s_q, topk), generator=generator, device=indices.device)
    rows = (torch.arange(s_q, device=indices.device) // group % every == 0).view(s_q, 1)
    copy = _random_mask((s_q, topk), _CORNER_SHARE, generator, indices.device) & rows
    result = dict(inputs)
    result["indices"] = torch.where(copy, indices.gather(1, source), indices).view(s_q, 1, topk).contiguous()
    return result


def index_overlap_stats(indices: torch.Tensor) -> IndexOverlap:
    """Retention and union-of-4 ratio of ``[s_q, 1, topk]`` (or ``[s_q, topk]``) indices.

    Negative indices are padding and ignored; a row's selection is its set of distinct indices.
    ``retention``: mean over rows i >= 1 with a non-empty selection of ``|S_i & S_{i-1}| / |S_i|``.
    ``union4``: mean over the groups of 4 adjacent rows (0-3, 4-7, ...) of ``|S_a | ... | S_d|``
    divided by the group's mean ``|S|``. Uniform random indices give a retention near topk / s_kv
    and a union near 4x for a small topk / s_kv. A statistic with nothing to average is NaN.
    """
    selections = indices.reshape(indices.shape[0], -1).long()
    sizes = _distinct_count(selections).double()

    pair_union = _distinct_count(torch.cat([selections[1:], selections[:-1]], dim=1)).double()
    shared = sizes[1:] + sizes[:-1] - pair_union
    retention = _mean_ratio(shared, sizes[1:])

    groups = selections.shape[0] // 4
    quads = selections[: 4 * groups].reshape(groups, 4 * selections.shape[1])
    group_size = sizes[: 4 * groups].reshape(groups, 4).mean(dim=1)
    union4 = _mean_ratio(_distinct_count(quads).double(), group_size)
    return IndexOverlap(retention=retention, union4=union4)


def _mean_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> float:
    """Mean of numerator / denominator over the entries with a positive denominator (NaN if none)."""
    keep = denominator > 0
    if not bool(keep.any()):
        return math.nan
    return (numerator[keep] / denominator[keep]).mean().item()


def _distinct_count(rows: torch.Tensor) -> torch.Tensor:
    """Number of distinct non-negative values in each row of a 2-D integer tensor."""
    ordered = rows.clamp_min(-1).sort(dim=1).values
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    return (first & (ordered >= 0)).sum(dim=1)

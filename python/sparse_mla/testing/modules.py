"""The package's launch plan run on a kernel module of one's own: the seam of A/B benchmarks.

A benchmark that times builds of the kernel from other sources side by side loads each build's module
with :func:`load_module` (a cache root filled by ``python -m sparse_mla prebuild`` from that source tree
holds it) and calls :func:`launch_with_module` with it: the same plan, scratch memory and entry call
as :func:`sparse_mla.sparse_mla_q8kv8_prefill_fwd` makes, on that module instead of the package's own.
The module must export the entries of this package's ``include/sparse_mla/entry.cuh``.
:func:`token_group_lists` makes the tensors that the token groups' pre-pass alone (``token_groups_fwd``)
writes, for tests that read its lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from sparse_mla import launch as _launch
from sparse_mla.args import PrefillArgs
from sparse_mla.jit import env
from sparse_mla.jit.cache import load_tvm_module

__all__ = ["PrefillArgs", "launch_with_module", "load_module", "token_group_lists"]


def load_module(so_path: str | Path) -> Any:
    """The kernel module in the shared object ``so_path``, its refused launches raising
    :class:`~sparse_mla.errors.KernelLaunchError` as the package's own do."""
    return load_tvm_module(Path(so_path))


def launch_with_module(module: Any, args: PrefillArgs, token_groups: Optional[str] = None) -> None:
    """Launches ``args`` (validated: build them as the API does, outputs included) with ``module``'s
    entries, on the plan the package makes for them. ``token_groups``: ``auto``, ``always`` or ``never``;
    by default ``SPARSE_MLA_TOKEN_GROUPS`` (``auto``)."""
    s_q, h_q, _ = args.q.shape
    if s_q == 0:
        return
    plan = _launch.plan_on(args.q.get_device(), s_q, h_q, args.indices.shape[2], args.batch_invariant,
                           env.token_groups() if token_groups is None else token_groups)
    _launch.execute(plan, getattr(module, plan.entry), args)


def token_group_lists(device: torch.device, s_q: int, group: int, topk: int) -> tuple[torch.Tensor, ...]:
    """Uninitialized tensors for the lists of s_q tokens in groups of ``group`` with topk slots each
    (``sparse_mla.launch.token_group_list_shapes``), in the order ``token_groups_fwd`` takes them
    (entry.cuh, check_token_group_lists): indices, masks, length, unit lists."""
    masks, indices, length, units = (torch.empty(shape, dtype=dtype, device=device)
                                     for shape, dtype in _launch.token_group_list_shapes(s_q, group, topk))
    return indices, masks, length, units

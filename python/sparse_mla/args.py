"""The arguments of one prefill call, as they travel from the API through the launch plan to the kernel.

:func:`sparse_mla.sparse_mla_q8kv8_prefill_fwd` builds one after validating the caller's arguments and
allocating the outputs the caller did not pass; :func:`sparse_mla.launch.launch` plans and launches it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class PrefillArgs(NamedTuple):
    """A validated call: its tensors (the outputs included), its softmax scale and its mode.

    The first eleven fields are, in order, the arguments every kernel entry starts with
    (include/sparse_mla/entry.cuh); a tuple, so that building one costs no more than the tuple itself.
    """

    q: torch.Tensor
    kv: torch.Tensor
    indices: torch.Tensor
    q_scale: torch.Tensor
    kv_scale: Optional[torch.Tensor]  # None in a call over the paged cache (kv is the cache)
    attn_sink: Optional[torch.Tensor]
    topk_length: Optional[torch.Tensor]
    out: torch.Tensor
    max_logits: torch.Tensor
    lse: torch.Tensor
    sm_scale: float
    batch_invariant: bool = False


# How many leading fields of PrefillArgs every entry takes.
ENTRY_ARGS = 11

"""GPU tier: the host path never waits for the GPU. On every launch path (wide, tail split, token groups,
narrow, batch-invariant), over contiguous rows and over the engines' paged cache, a call queued behind
GPU work returns while that work is still running.

No wall-clock bound: the sleep kernel ahead of the call runs far longer than any host path, and an
event recorded right after it tells whether it had ended when the call returned."""

from __future__ import annotations

import pytest
import torch

from sparse_mla import launch, sparse_mla_q8kv8_paged_prefill_fwd
from sparse_mla.testing import PRESETS, as_paged_call, make_inputs, realistic_indices

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 2**27  # torch.cuda._sleep: about 70 ms on an H200, far longer than a host-side launch
D_QK, TOPK = 576, 2048

# (the path, what its plan launches, s_q, s_kv, h_q, batch_invariant, SPARSE_MLA_TOKEN_GROUPS)
PATHS = [
    ("wide", ("prefill_fwd", ("wide",)), 200, 8192, 64, False, "auto"),
    ("split", ("prefill_split_fwd", ("wide",)), 8, 8192, 128, False, "auto"),
    ("grouped", ("prefill_token_groups_fwd", ("grouped", "narrow16")), 256, 8192, 16, False, "auto"),
    ("narrow", ("prefill_fwd", ("narrow8",)), 100, 8192, 8, False, "never"),
    ("batch-invariant narrow", ("prefill_fwd", ("narrow16",)), 16, 8192, 16, True, "auto"),
    ("batch-invariant wide", ("prefill_fwd", ("wide",)), 8, 8192, 128, True, "auto"),
]


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("path, launches, s_q, s_kv, h_q, batch_invariant, token_groups", PATHS,
                         ids=[p[0] for p in PATHS])
def test_a_call_queued_behind_gpu_work_returns_before_that_work_ends(
    prefill_fwd, monkeypatch, path, launches, s_q, s_kv, h_q, batch_invariant, token_groups, layout
):
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", token_groups)
    num_sms = launch.num_sms(torch.cuda.current_device())
    plan = launch.plan(s_q, h_q, TOPK, num_sms, batch_invariant, token_groups)
    assert (plan.entry, plan.tiles) == launches, f"{path}: this GPU ({num_sms} SMs) plans {plan}"
    inputs = make_inputs(s_q, s_kv, h_q, D_QK, TOPK, seed=0)
    inputs["indices"] = realistic_indices(s_q, s_kv, TOPK, **PRESETS["realistic-glm"], seed=0)
    call = prefill_fwd
    if layout == "paged":  # the same plan, through the module's paged entries
        call, inputs = sparse_mla_q8kv8_paged_prefill_fwd, as_paged_call(inputs)
    expected = call(**inputs, batch_invariant=batch_invariant)  # loads the kernel, plans the shape
    torch.cuda.synchronize()

    torch.cuda._sleep(SLEEP_CYCLES)
    slept = torch.cuda.Event()
    slept.record()
    got = call(**inputs, batch_invariant=batch_invariant)
    still_sleeping = not slept.query()
    torch.cuda.synchronize()
    assert still_sleeping, f"{path}: the call returned only after the GPU work queued ahead of it had ended"
    for name, a, b in zip(("out", "max_logits", "lse"), expected, got):
        assert torch.equal(a, b), f"{path}: {name} of the queued call differs from the idle call's"

"""Run under compute-sanitizer by test_reliability.py: ``python sanitize_case.py SEED CASE``.

- ``small``: hostile indices, NaN rows behind invalid slots, all-invalid rows, special sinks and
  strided q and kv, on small shapes and three kernel keys (ragged topk included).
- ``pipeline``: the whole production pipeline at a size the sanitizer finishes: topk 2048 (every
  stage of the topk loop, both buffers of every ring), d_qk 576, h_q 72 (two head blocks, the second
  one masked past head 72), hostile indices (-1, s_kv, INT32_MAX, INT32_MIN) in a quarter of the
  slots, NaN KV rows behind invalid slots, a row with no valid slot, topk_length of 0, negative,
  past topk and in between, and sinks of +-inf, +-1e30 and finite values; s_q 6, so the 12 work
  items (token, head block) are each cut into 4 parts that are merged (the tail split).
- ``units``: more work units than CTAs, so each CTA runs several units back to back: s_q = 2 * SMs + 5
  rows of 64 heads (every CTA takes two or three items, the last 5 items split in 2 parts), topk 512,
  topk_length cycling through 0, 100 and 512 (units of 0, 1 and 4 pairs follow each other on one CTA:
  the q_empty wait, stage and P-buffer reuse across units, an item followed by a split part), hostile
  indices and sinks.
- ``narrow``: the narrow tiles alone (h_q 8: 8 heads; h_q 16: 16; h_q 24: 32; token groups off) with more work units than CTAs:
  s_q = 3 * SMs - 1 tokens (no tail split), topk 512, topk_length 0 / 100 / 512 in turn (units of 0, 1 and 4 pairs
  follow each other on every CTA: the producer's lookahead across units, the early release of each
  pair), hostile indices, NaN rows behind invalid slots, sinks.
- ``groups``: token groups (h_q 16, 4 tokens per group) with more groups than CTAs: half the groups
  share most of their slots, half do not, so in the automatic mode grouped and narrow units (each
  launch skipping the other's) follow each other on every CTA; then every group grouped. topk 512,
  topk_length 0 / 100 / 512 in turn, hostile indices, duplicates in every fourth group (which falls
  back), NaN rows behind invalid slots, sinks. At s_kv 4K the pre-pass's owner map holds a byte per
  kv row; the same at s_kv 128K with groups of 4 (h_q 16) and 2 (h_q 32) packs it to 4 and 2 bits,
  and groups of 8 (h_q 8) keep a byte per row in CTAs of 1024 threads.
- ``paged``: the ``small``, ``pipeline`` and ``narrow`` cases and the first ``groups`` one over the engines'
  paged cache (sparse_mla_q8kv8_paged_prefill_fwd): kv's values, NaN rows included, written as 656-byte
  rows into shuffled blocks of 64 rows a block stride of 65 rows apart, the indices mapped to them
  (hostile values outside the cache kept), checked with the acceptance rule over the keys the kernel
  reads (requantized_keys).

Each result is checked against the reference with the acceptance rule; the script prints
SANITIZE-CASE-OK at the end.
"""

import os
import sys

import torch

from sparse_mla import sparse_mla_q8kv8_paged_prefill_fwd, sparse_mla_q8kv8_prefill_fwd
from sparse_mla.launch import group_size
from sparse_mla.testing import (
    INT32_MAX,
    INT32_MIN,
    as_paged_call,
    as_read_inputs,
    assert_close_to_reference,
    error_model,
    make_inputs,
    poisoned_outputs,
    reference_prefill,
    with_duplicated_groups,
    with_shared_neighbours,
)


def small_cases(seed: int):
    for d_qk, topk in ((576, 64), (512, 64), (576, 7)):
        inputs = make_inputs(
            s_q=16, s_kv=256, h_q=20, d_qk=d_qk, topk=topk, seed=seed, invalid="hostile", all_invalid_rows=3,
            nan_kv_rows=True, topk_length="random", attn_sink="special", q_strided=True, kv_strided=True,
        )
        yield f"d_qk {d_qk}, topk {topk}", inputs


def pipeline_cases(seed: int):
    topk = 2048
    inputs = make_inputs(
        s_q=6, s_kv=4096, h_q=72, d_qk=576, topk=topk, seed=seed, invalid="hostile", all_invalid_rows=1,
        nan_kv_rows=True, attn_sink="special",
    )
    # One row each: no slot (0), negative, a ragged length, past topk, INT32_MAX, INT32_MIN; every slot
    # past a row's length names KV row 0, which holds NaN (a valid-looking index in an invalid slot).
    lengths = [0, -1, topk - 37, topk + 1, INT32_MAX, INT32_MIN]
    length = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    past = torch.arange(topk, device="cuda") >= length.long().clamp(0, topk).unsqueeze(1)
    inputs["indices"][:, 0][past] = 0
    inputs["topk_length"] = length
    yield f"pipeline: d_qk 576, topk {topk}, h_q 72, topk_length {lengths}", inputs


def lengths_in_turn(s_q: int, topk: int, sms: int) -> torch.Tensor:
    """topk_length 0, 100 and topk in turn over the work units of each CTA: CTA b runs units b, b + sms,
    b + 2 sms, ..., so unit i takes length (i + i // sms) % 3 (by i % 3 alone, every CTA of a GPU whose
    SM count is a multiple of 3, as an H200's 132, would run one length only)."""
    return torch.tensor([(0, 100, topk)[(i + i // sms) % 3] for i in range(s_q)], dtype=torch.int32, device="cuda")


def units_cases(seed: int):
    topk = 512
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    s_q = 2 * sms + 5
    inputs = make_inputs(
        s_q=s_q, s_kv=4096, h_q=64, d_qk=576, topk=topk, seed=seed, invalid="hostile", nan_kv_rows=True,
        attn_sink="special",
    )
    inputs["topk_length"] = lengths_in_turn(s_q, topk, sms)
    yield f"units: s_q {s_q}, h_q 64, d_qk 576, topk {topk}, topk_length 0 / 100 / {topk} in turn", inputs


def narrow_cases(seed: int):
    topk = 512
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    s_q = 3 * sms - 1  # a last round of sms - 1 items: no tail split, which would take the wide tile
    for h_q in (8, 16, 24):  # the 8-head tile, the 16-head one, the 32-head one
        inputs = make_inputs(
            s_q=s_q, s_kv=4096, h_q=h_q, d_qk=576, topk=topk, seed=seed, invalid="hostile", nan_kv_rows=True,
            attn_sink="special",
        )
        inputs["topk_length"] = lengths_in_turn(s_q, topk, sms)
        os.environ["SPARSE_MLA_TOKEN_GROUPS"] = "never"  # read by the call that follows the yield
        yield f"narrow: s_q {s_q}, h_q {h_q}, d_qk 576, topk {topk}, topk_length 0 / 100 / {topk} in turn", inputs


def groups_cases(seed: int):
    topk = 512
    for s_kv, h_q, modes in ((4096, 16, ("auto", "always")), (131072, 16, ("auto",)), (131072, 32, ("auto",)),
                             (131072, 8, ("auto",))):
        group = group_size(h_q, topk)
        s_q = group * (2 * torch.cuda.get_device_properties(0).multi_processor_count + 1) + 3
        inputs = make_inputs(
            s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=576, topk=topk, seed=seed, invalid="hostile", nan_kv_rows=True,
            attn_sink="special",
        )
        shared = with_shared_neighbours(inputs, group, 0.9, seed)
        half = (torch.arange(s_q, device="cuda") // group % 2 == 0).view(s_q, 1, 1)
        inputs["indices"] = torch.where(half, shared["indices"], inputs["indices"]).contiguous()
        inputs = with_duplicated_groups(inputs, group, seed=seed)  # every other overlapping group
        inputs["topk_length"] = torch.tensor([(0, 100, topk)[i % 3] for i in range(s_q)], dtype=torch.int32, device="cuda")
        for mode in modes:
            os.environ["SPARSE_MLA_TOKEN_GROUPS"] = mode  # read by the call that follows the yield
            yield (f"groups ({mode}): s_q {s_q}, s_kv {s_kv}, h_q {h_q}, d_qk 576, topk {topk}, half the groups "
                   "overlapping"), inputs


PAGE = 64


def paged_cases(seed: int):
    """Other cases' inputs over a paged cache: (name, paged call's arguments)."""
    sources = [small_cases(seed), pipeline_cases(seed), narrow_cases(seed)]
    first_groups = next(groups_cases(seed))
    for name, inputs in (case for source in sources for case in source):
        yield f"paged {name}", as_paged_call(inputs, PAGE, block_stride_pad=1, seed=seed)
    yield f"paged {first_groups[0]}", as_paged_call(first_groups[1], PAGE, block_stride_pad=1, seed=seed)


def check_paged(result, args: dict, context: str) -> None:
    """The acceptance rule over the keys the kernel reads (requantized_keys): hostile inputs come from
    e4m3 rows whose tiles share one scale, where the requantization's second rounding alone moves out
    by ~3e-2 against the cache's own values (as the engines' path does); requantized_rows' tests
    (cpu tier) bound that step, this checks the kernel's arithmetic and special values around it."""
    inputs = as_read_inputs(**args)
    assert_close_to_reference(*result, reference_prefill(**inputs), model=error_model(**inputs), lse_tol=None,
                              max_logits_tol=None, context=context)


seed, case = int(sys.argv[1]), sys.argv[2]
if case == "paged":
    for name, args in paged_cases(seed):
        s_q, h_q, _ = args["q"].shape
        result = sparse_mla_q8kv8_paged_prefill_fwd(**args, **poisoned_outputs(s_q, h_q, device="cuda"))
        torch.cuda.synchronize()
        check_paged(result, args, f"seed {seed}, {name}")
    print("SANITIZE-CASE-OK")
    sys.exit(0)
cases = {"small": small_cases, "pipeline": pipeline_cases, "units": units_cases, "narrow": narrow_cases,
         "groups": groups_cases}
for name, inputs in cases[case](seed):
    s_q, h_q, _ = inputs["q"].shape
    result = sparse_mla_q8kv8_prefill_fwd(**inputs, **poisoned_outputs(s_q, h_q, device="cuda"))
    torch.cuda.synchronize()
    assert_close_to_reference(
        *result, reference_prefill(**inputs), model=error_model(**inputs), lse_tol=None, max_logits_tol=None,
        context=f"seed {seed}, {name}",
    )
print("SANITIZE-CASE-OK")

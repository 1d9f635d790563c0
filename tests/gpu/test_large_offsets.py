"""GPU tier: offsets past 32 bits. A kernel that computes a KV row's address, or a q / out element's
offset, in 32-bit arithmetic wraps around and reads or writes the wrong place; these tests put the
data exactly there.

- KV past 2^31 bytes: s_kv rows of d_qk bytes with s_kv * d_qk > 2^31, indices pointing at rows past
  2^31 / d_qk (and at the row that straddles 2^31, and the last row). Every other KV row holds NaN, so
  a wrapped or truncated address turns the output NaN; only the gathered rows hold random data.
- out past 2^32 bytes (and q past 2^31): s_q * h_q * 512 * 2 > 2^32. Every output element starts as
  NaN; all must be written, and a sample of rows (the first, the last, across the 2^31 and 2^32
  boundaries, and random ones) is compared with the reference.

Each runs on the three paths whose addressing differs: the 64-head tile (h_q 64 or 128), the narrow
tile (h_q 16, token groups off) and token groups (h_q 16, every group grouped, over selections that
adjacent tokens mostly share: the grouped tile gathers from the group's list and stores each tile row
to its own token's row).

Each test skips, visibly, when the GPU lacks the memory.
"""

from __future__ import annotations

import pytest
import torch

from sparse_mla.launch import group_size
from sparse_mla.testing import FP8_E4M3_MAX, error_model, poisoned_outputs, reference_prefill

pytestmark = pytest.mark.gpu

_FP8_NAN = 0x7F
_SIGMA_RANGE = 4.0  # randn values are quantized with the scale 4 / 448 (|x| > 4 saturates)


def describe(seed: int, **shape) -> str:
    fields = " ".join(f"{name}={value}" for name, value in shape.items())
    return f"seed={seed} (SPARSE_MLA_TEST_SEED={seed} replays) {fields}"


def _require_free_memory(needed_bytes: int) -> None:
    free, total = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    if free < needed_bytes:
        pytest.skip(f"GPU tier: needs {needed_bytes / 2**30:.1f} GiB of free GPU memory, "
                    f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")


def _random_fp8(shape, generator) -> torch.Tensor:
    """randn quantized to e4m3 with the fixed scale ``_SIGMA_RANGE / 448`` (see ``_scale``)."""
    values = torch.randn(shape, device="cuda", generator=generator) * (FP8_E4M3_MAX / _SIGMA_RANGE)
    return values.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def _scale() -> torch.Tensor:
    return torch.full((1,), _SIGMA_RANGE / FP8_E4M3_MAX, device="cuda")


def _distinct_rows(candidates: torch.Tensor, s_q: int, topk: int, generator) -> torch.Tensor:
    """``[s_q, 1, topk]`` int32: per query row, topk distinct entries of ``candidates`` in random order."""
    scores = torch.rand(s_q, candidates.numel(), device="cuda", generator=generator)
    return candidates[scores.topk(topk, dim=1).indices].to(torch.int32).unsqueeze(1).contiguous()


PATHS = {"wide": None, "narrow": "never", "grouped": "always"}  # SPARSE_MLA_TOKEN_GROUPS of each path
SHARED = 0.9  # the share of a group's rows every token of it selects, on the grouped path


def _group_rows(candidates: torch.Tensor, s_q: int, topk: int, group: int, generator) -> torch.Tensor:
    """``[s_q, 1, topk]`` int32 entries of ``candidates``, distinct within each query row: each run of
    ``group`` adjacent rows selects SHARED of topk rows in common, the rest its own rows."""
    common = round(SHARED * topk)
    own = topk - common
    indices = torch.empty(s_q, 1, topk, dtype=torch.int32, device="cuda")
    groups = -(-s_q // group)
    for start in range(0, groups, 1024):  # in slices, to keep the scores small
        stop = min(start + 1024, groups)
        ranked = _distinct_rows(candidates, stop - start, common + group * own, generator)[:, 0]
        for t in range(group):
            rows = torch.cat([ranked[:, :common], ranked[:, common + t * own:common + (t + 1) * own]], dim=1)
            tokens = torch.arange(start, stop, device="cuda") * group + t
            keep = tokens < s_q
            indices[tokens[keep], 0] = rows[keep]
    return indices


def _selections(path: str, candidates: torch.Tensor, s_q: int, topk: int, h_q: int, generator) -> torch.Tensor:
    if path == "grouped":
        return _group_rows(candidates, s_q, topk, group_size(h_q, topk), generator)
    return _distinct_rows(candidates, s_q, topk, generator)


def _take_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t[rows]``; FP8 is indexed as uint8, which every torch build supports."""
    if t.element_size() == 1:
        return t.view(torch.uint8)[rows].view(t.dtype)
    return t[rows]


def _check(result, inputs: dict, rows: torch.Tensor, context: str) -> None:
    """The acceptance rule on the sampled query ``rows`` only (the reference of every row would take
    minutes); the rest of the output was checked for NaN by the caller."""
    from sparse_mla.testing import assert_close_to_reference

    sampled = dict(inputs, q=_take_rows(inputs["q"], rows), indices=inputs["indices"][rows])
    if inputs["topk_length"] is not None:
        sampled["topk_length"] = inputs["topk_length"][rows]
    assert_close_to_reference(
        *(t[rows] for t in result), reference_prefill(**sampled), model=error_model(**sampled), lse_tol=1e-4,
        max_logits_tol=1e-3, context=context,
    )


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (512, 512)])
def test_kv_rows_past_2_to_the_31_bytes(prefill_fwd, seed, monkeypatch, d_qk, topk, path):
    first_far_row = 2**31 // d_qk  # the row holding byte 2^31 (it straddles it at d_qk 576)
    s_kv = first_far_row + 65536  # 2.2 GB of KV
    s_q, h_q = 64, 64 if path == "wide" else 16
    if PATHS[path] is not None:
        monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", PATHS[path])
    _require_free_memory(s_kv * d_qk + 2 * 2**30)
    generator = torch.Generator(device="cuda").manual_seed(seed)

    kv = torch.empty(s_kv, 1, d_qk, dtype=torch.float8_e4m3fn, device="cuda")
    kv.view(torch.uint8).fill_(_FP8_NAN)  # only gathered rows get data: any other read gives NaN
    far = torch.arange(first_far_row, s_kv, device="cuda")
    near = torch.arange(first_far_row - 8, first_far_row, device="cuda")  # just below the boundary
    candidates = torch.cat([near, far])
    indices = _selections(path, candidates, s_q, topk, h_q, generator)
    indices[0, 0, 0] = s_kv - 1  # the very last row (it is in `far`, so drop its other copy)
    indices[0, 0, 1:] = _distinct_rows(candidates[:-1], 1, topk - 1, generator)[0, 0]
    indices[1, 0, 0] = first_far_row  # the row that contains byte 2^31
    indices[1, 0, 1:] = _distinct_rows(candidates[candidates != first_far_row], 1, topk - 1, generator)[0, 0]
    used = torch.unique(indices.long())
    kv.view(torch.uint8)[used] = _random_fp8((used.numel(), 1, d_qk), generator).view(torch.uint8)
    inputs = dict(
        q=_random_fp8((s_q, h_q, d_qk), generator), kv=kv, indices=indices, sm_scale=d_qk**-0.5, q_scale=_scale(),
        kv_scale=_scale(), d_v=512, attn_sink=None, topk_length=None,
    )

    result = prefill_fwd(**inputs, **poisoned_outputs(s_q, h_q, device="cuda"))
    context = describe(seed, s_kv=s_kv, kv_bytes=s_kv * d_qk, d_qk=d_qk, topk=topk, path=path)
    _check(result, inputs, torch.arange(s_q, device="cuda"), context)


@pytest.mark.parametrize("path", list(PATHS))
def test_out_past_2_to_the_32_bytes(prefill_fwd, seed, monkeypatch, path):
    h_q, d_qk, topk, s_kv = 128 if path == "wide" else 16, 576, 2048, 8192
    if PATHS[path] is not None:
        monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", PATHS[path])
    s_q = 2**32 // (h_q * 512 * 2) + 256  # out: 4.3 GB; q: 2.4 GB (past 2^31 too)
    out_bytes = s_q * h_q * 512 * 2
    _require_free_memory(out_bytes + s_q * h_q * d_qk + s_q * topk * 4 + 6 * 2**30)
    generator = torch.Generator(device="cuda").manual_seed(seed)

    q = torch.empty(s_q, h_q, d_qk, dtype=torch.float8_e4m3fn, device="cuda")
    for start in range(0, s_q, 4096):  # in slices, to keep the float32 temporaries small
        stop = min(start + 4096, s_q)
        q[start:stop] = _random_fp8((stop - start, h_q, d_qk), generator)
    indices = torch.empty(s_q, 1, topk, dtype=torch.int32, device="cuda")
    pool = torch.arange(s_kv, device="cuda")
    for start in range(0, s_q, 4096 * 8):  # a multiple of every group size
        stop = min(start + 4096 * 8, s_q)
        indices[start:stop] = _selections(path, pool, stop - start, topk, h_q, generator)
    inputs = dict(
        q=q, kv=_random_fp8((s_kv, 1, d_qk), generator), indices=indices, sm_scale=d_qk**-0.5, q_scale=_scale(),
        kv_scale=_scale(), d_v=512, attn_sink=None, topk_length=None,
    )

    result = prefill_fwd(**inputs, **poisoned_outputs(s_q, h_q, device="cuda"))
    torch.cuda.synchronize()
    context = describe(seed, s_q=s_q, h_q=h_q, out_bytes=out_bytes, d_qk=d_qk, topk=topk, path=path)
    for name, tensor in zip(("out", "max_logits", "lse"), result):
        unwritten = int(torch.isnan(tensor).sum())
        assert unwritten == 0, f"{context}: {unwritten} {name} elements were never written (still NaN)"

    row_of_byte = lambda byte: byte // (h_q * 512 * 2)  # noqa: E731 - the query row holding an out byte
    boundaries = [row_of_byte(2**31), row_of_byte(2**32), 2**31 // (h_q * d_qk)]  # out 2^31, out 2^32, q 2^31
    rows = [0, 1, s_q - 2, s_q - 1] + [r + k for r in boundaries for k in (-1, 0, 1)]
    random_rows = torch.randint(0, s_q, (16,), device="cuda", generator=generator).tolist()
    rows = torch.tensor(sorted(set(rows + random_rows)), device="cuda")
    _check(result, inputs, rows, context)

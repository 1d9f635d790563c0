"""A prefix-hit step over the engines' paged FP8 cache: as serving engines run it today, and read in place.

Each of ``--batch`` requests holds ``context`` tokens in a paged 656-byte FP8 latent cache (64 rows a
block, the blocks of all requests shuffled together; the new tokens' rows are written before
attention, so they are the last ``s_q`` of the context); each new token selects topk rows of its own
request's context (realistic-glm, causal). Per row, each timed as one interval of CUDA events, the L2
flushed before each, the calls interleaved (`interleaved_median_ms`):

- pass: the engines' pass over the whole batch's context (engine_pass.py: gather, dequantize,
  requantize to e4m3 at scale 1.0, append topk zero rows), also as us per 64K context rows (sglang
  publishes 15.6 for its own on an H200) and as a share of the card's copy bandwidth (bytes read and
  written over a device-to-device copy of 256K rows, measured once per run);
- ours, incumbent: the contiguous kernels alone on the pass's output (the incumbent on q padded to
  64 heads);
- (a) sparse_mla_q8kv8_paged_prefill_fwd on the cache as it is (no pass);
- (b) pass + ours, (c) pass + incumbent: the step as an engine runs it with either kernel;
- err (a), err (b): (a), and ours on the pass's output (the engines' path: nope values rounded twice,
  rope once), against the float64 reference over the dequantized cache, for the first request's first
  16 tokens.

    python benchmarks/prefix_hit.py --incumbent .incumbent/sglang_q8kv8.so --json prefix_hit.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # benchmarks/ is no package
from common import git_commit, padded_incumbent_call  # noqa: E402
from engine_pass import engine_pass  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_paged_prefill_fwd, sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import (PAGED_ROW_BYTES, PRESETS, interleaved_median_ms, median_time_ms,  # noqa: E402
                                poisoned_outputs, quantize_fp8, quantize_paged_cache, random_latent,
                                realistic_indices, reference_prefill_paged, relative_error)

D_QK, TOPK, BLOCK = 576, 2048, 64
CHECKED_TOKENS = 16


class Batch:
    """``requests`` requests of ``context`` tokens each in one shuffled paged cache."""

    def __init__(self, requests: int, context: int, seed: int):
        if context % BLOCK:
            raise ValueError(f"context must be whole blocks of {BLOCK} rows, got {context}")
        self.requests, self.context = requests, context
        blocks = context // BLOCK
        generator = torch.Generator(device="cuda").manual_seed(seed)
        self.tables = torch.randperm(requests * blocks, device="cuda", generator=generator).view(requests, blocks)
        # Request r's token t is token r * context + t of the latent, in block tables[r, t // BLOCK].
        latent = random_latent(requests * context, D_QK, seed=seed, device="cuda")
        self.cache = quantize_paged_cache(latent, BLOCK, block_table=self.tables.flatten(), num_blocks=requests * blocks)
        positions = torch.arange(context, device="cuda")
        self.rows = (self.tables[:, positions // BLOCK] * BLOCK + positions % BLOCK).flatten().to(torch.int32)

    def indices(self, s_q: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each request's new tokens' selections: as rows of the pass's output, and as flat paged rows."""
        buffer_rows, paged_rows = [], []
        for r in range(self.requests):
            local = realistic_indices(s_q, self.context, TOPK, **PRESETS["realistic-glm"], seed=seed + r)
            valid = local >= 0
            buffer_rows.append(torch.where(valid, local + r * self.context, local))
            paged_rows.append(torch.where(valid, self.rows[(local + r * self.context).clamp(min=0).long()], local))
        return torch.cat(buffer_rows), torch.cat(paged_rows)


def device_copy_gbs(rows: int = 262144) -> float:
    """GB/s (bytes read plus written) of a device-to-device copy of ``rows`` 656-byte rows, L2 flushed."""
    src = torch.empty(rows * PAGED_ROW_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_time_ms(lambda: dst.copy_(src), iters=20) / 1e6


def measure(batch: Batch, s_q: int, h_q: int, dispatch, iters: int, seed: int) -> dict:
    tokens = batch.requests * s_q
    # Logits of standard deviation ~3: the latent's largest tiles are ~32 randn (random_latent), so q of
    # 0.2 randn; at q ~ randn they would be ~15, a softmax so peaky that any rounding of a logit moves
    # the output, and the error column would measure that rather than the cache's path.
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, q_scale = quantize_fp8(0.2 * torch.randn(tokens, h_q, D_QK, device="cuda", generator=generator))
    kv_scale = torch.ones(1, dtype=torch.float32, device="cuda")
    sm_scale = D_QK ** -0.5
    buffer_indices, paged_indices = batch.indices(s_q, seed)
    kv = engine_pass(batch.cache, batch.rows, TOPK)
    outputs = poisoned_outputs(tokens, h_q, 512)

    def ours(kv_buffer):
        sparse_mla_q8kv8_prefill_fwd(q, kv_buffer, buffer_indices, sm_scale, q_scale, kv_scale, **outputs)

    paged_outputs = poisoned_outputs(tokens, h_q, 512)

    def paged():
        sparse_mla_q8kv8_paged_prefill_fwd(q, batch.cache, paged_indices, sm_scale, q_scale, **paged_outputs)

    calls = {"pass": lambda: engine_pass(batch.cache, batch.rows, TOPK), "ours": lambda: ours(kv),
             "(b)": lambda: ours(engine_pass(batch.cache, batch.rows, TOPK)), "(a)": paged}
    if dispatch is not None:
        inputs = dict(q=q, kv=kv, indices=buffer_indices, q_scale=q_scale, kv_scale=kv_scale, d_v=512,
                      sm_scale=sm_scale)
        incumbent = padded_incumbent_call(dispatch, inputs, kv.shape[0])
        calls["incumbent"] = incumbent
        calls["(c)"] = lambda: (engine_pass(batch.cache, batch.rows, TOPK), incumbent())
    times = interleaved_median_ms(calls, iters=iters)

    ours(kv)
    paged()
    checked = slice(0, CHECKED_TOKENS)
    expected = reference_prefill_paged(q[checked], batch.cache, paged_indices[checked], sm_scale, q_scale)
    row = dict(requests=batch.requests, context=batch.context, s_q=s_q, h_q=h_q, context_rows=batch.rows.numel(),
               pass_us_per_64k_rows=times["pass"] * 1e3 * 65536 / batch.rows.numel(),
               pass_gbs=(batch.rows.numel() * (PAGED_ROW_BYTES + D_QK) + TOPK * D_QK) / times["pass"] / 1e6,
               engine_path_out_rel_err=relative_error(outputs["out"][checked], expected[0]),
               paged_out_rel_err=relative_error(paged_outputs["out"][checked], expected[0]))
    row.update({f"{name}_ms": ms for name, ms in times.items()})
    return row


def format_table(rows: list[dict], copy_gbs: float) -> str:
    side = "incumbent_ms" in rows[0]
    head = (f"{'req':>3} {'context':>7} {'s_q':>5} {'h_q':>4} | {'pass us':>8} {'/64K':>6} {'of copy':>7} | {'ours':>8} {'(b)':>8}"
            + (f" | {'incumbent':>9} {'(c)':>8}" if side else "")
            + f" | {'pass/(b)':>8} | {'(a)':>8} {'(b)/(a)':>7} {'saved':>6} | {'err (a)':>8} {'err (b)':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['requests']:>3} {r['context']:>7} {r['s_q']:>5} {r['h_q']:>4} | {r['pass_ms'] * 1e3:>8.1f} "
                f"{r['pass_us_per_64k_rows']:>6.1f} {r['pass_gbs'] / copy_gbs:>7.2f} | {r['ours_ms'] * 1e3:>8.1f} "
                f"{r['(b)_ms'] * 1e3:>8.1f}")
        if side:
            line += f" | {r['incumbent_ms'] * 1e3:>9.1f} {r['(c)_ms'] * 1e3:>8.1f}"
        saved = (r['(b)_ms'] - r['(a)_ms']) / r['pass_ms']  # of the pass's time
        line += (f" | {r['pass_ms'] / r['(b)_ms']:>8.2f} | {r['(a)_ms'] * 1e3:>8.1f} {r['(b)_ms'] / r['(a)_ms']:>7.2f}"
                 f" {saved:>6.2f} | {r['paged_out_rel_err']:>8.2e} {r['engine_path_out_rel_err']:>8.2e}")
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--s-q", type=int, nargs="+", default=[16, 64, 256, 1024, 4096])
    parser.add_argument("--context", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--heads", type=int, nargs="+", default=[128, 16])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--incumbent", type=pathlib.Path, metavar="SO", help="tvm-ffi module of the incumbent")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    dispatch = None
    if args.incumbent is not None:
        import tvm_ffi

        dispatch = tvm_ffi.load_module(str(args.incumbent))["dispatch"]
    copy_gbs = device_copy_gbs()
    rows = []
    for requests in args.batch:
        for context in args.context:
            batch = Batch(requests, context, args.seed)
            for s_q in args.s_q:
                if s_q > context or requests * s_q > 8192:
                    continue  # a step of at most 8K new tokens
                for h_q in args.heads:
                    rows.append(measure(batch, s_q, h_q, dispatch, args.iters, args.seed))
                    print(format_table(rows[-1:], copy_gbs).splitlines()[-1], flush=True)
            del batch
    print(f"\n{torch.cuda.get_device_name()}, realistic-glm indices, d_qk {D_QK}, topk {TOPK}; "
          f"median of {args.iters} interleaved calls, L2 flushed; us. The pass's share of a device copy's "
          f"{copy_gbs:.0f} GB/s in 'of copy'; sglang publishes 15.6 us per 64K rows for its pass on an H200")
    print(format_table(rows, copy_gbs))
    if args.json:
        args.json.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(
            timespec="seconds"), commit=git_commit(), copy_gbs=copy_gbs, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

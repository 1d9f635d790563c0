"""The rate at which the library's calls gather kv rows, for comparison with gather.cu's raw rates on
the same GPU: uniform indices (every token's 2,048 rows distinct, no union to share), token groups
off, s_q 4096, h_q 8 / 16 / 64, s_kv 8K and 128K; the benchmark protocol (L2 flushed before each
timed call, interleaved, the median). Prints ms and GB/s of gathered rows (s_q * topk * 576 / t).

    python benchmarks/experiments/gather_bandwidth/tile_rate.py
"""

import os

os.environ["SPARSE_MLA_TOKEN_GROUPS"] = "never"

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import interleaved_median_ms, make_inputs, poisoned_outputs  # noqa: E402

S_Q, TOPK = 4096, 2048
for s_kv in (8192, 131072):
    calls = {}
    for h_q in (8, 16, 64):
        inputs = make_inputs(S_Q, s_kv, h_q, 576, TOPK, seed=0)
        outputs = poisoned_outputs(S_Q, h_q)
        calls[h_q] = lambda inputs=inputs, outputs=outputs: sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
    times = interleaved_median_ms(calls, iters=20)
    for h_q, ms in times.items():
        print(f"s_kv {s_kv:6d} h_q {h_q:3d}: {ms:.3f} ms, {S_Q * TOPK * 576 / (ms * 1e6):.0f} GB/s gathered")

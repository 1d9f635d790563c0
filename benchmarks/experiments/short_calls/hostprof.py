"""Probe: where the host time of one call goes (median us of 200 calls, GPU idle between calls)."""
import os, statistics, time
import torch
from sparse_mla import launch, sparse_mla_q8kv8_prefill_fwd
from sparse_mla.args import PrefillArgs
from sparse_mla.validate import validate_prefill_args, check_row_alignment
from sparse_mla.jit import env
from sparse_mla.testing import PRESETS, make_inputs, realistic_indices, poisoned_outputs

def med(fn, reps=200, sync=True):
    ts = []
    for _ in range(reps):
        if sync: torch.cuda.synchronize()
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6

for s_q, s_kv, h_q, tg in [(4096, 32768, 128, "auto"), (64, 65536, 128, "auto"), (437, 8192, 64, "auto"),
                           (4096, 8192, 16, "auto"), (1024, 131072, 8, "never"), (16, 65536, 16, "auto")]:
    os.environ["SPARSE_MLA_TOKEN_GROUPS"] = tg
    inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
    inputs["indices"] = realistic_indices(s_q, s_kv, 2048, **PRESETS["realistic-glm"], seed=0)
    q, kv = inputs["q"], inputs["kv"]
    o = poisoned_outputs(s_q, h_q, 512)
    for _ in range(5): sparse_mla_q8kv8_prefill_fwd(**inputs)
    torch.cuda.synchronize()
    a = inputs
    full = med(lambda: sparse_mla_q8kv8_prefill_fwd(**a))
    pre = med(lambda: sparse_mla_q8kv8_prefill_fwd(**a, **o))
    val = med(lambda: validate_prefill_args(q, kv, a["indices"], a["sm_scale"], a["q_scale"], a["kv_scale"], 512, None, None, None, None, None))
    alloc = med(lambda: (q.new_empty((s_q, h_q, 512), dtype=torch.bfloat16), q.new_empty((s_q, h_q), dtype=torch.float32), q.new_empty((s_q, h_q), dtype=torch.float32)))
    args = PrefillArgs(q, kv, a["indices"], a["q_scale"], a["kv_scale"], None, None, o["out"], o["max_logits"], o["lse"], a["sm_scale"], False)
    def lookup():
        return launch._planned_entry(q.get_device(), 576, s_q, h_q, 2048, False, env.token_groups())
    look = med(lookup)
    p, fn = lookup()
    ex = med(lambda: launch.execute(p, fn, args))
    ex_nosync = med(lambda: launch.execute(p, fn, args), sync=False)
    align = med(lambda: check_row_alignment(q, kv))
    print(f"{s_q:>5} {s_kv:>6} {h_q:>4} {p.entry:<26} | call {full:6.1f} prealloc {pre:6.1f} | validate {val:5.1f} alloc3 {alloc:5.1f} "
          f"lookup {look:5.1f} align {align:4.1f} execute {ex:6.1f} (back-to-back {ex_nosync:6.1f})", flush=True)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS")

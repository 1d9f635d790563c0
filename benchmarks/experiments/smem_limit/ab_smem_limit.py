"""Experiment 144 in one process: each overhead.py row's host time (median of 50, GPU idle and queued
behind 2 ms of work) through HEAD's module and the patched module (the shared-memory limit set once per
device), interleaved twice (base, new, base, new), and the two modules' outputs compared bitwise.
Run from the repository root with the package of either tree (the Python side is the same):
    python benchmarks/experiments/smem_limit/ab_smem_limit.py base=CACHE_ROOT new=CACHE_ROOT"""
import os
import pathlib
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
from overhead import D_QK, D_V, ROWS, TOPK, host_times, sleep_cycles_for  # noqa: E402

from sparse_mla import launch as L  # noqa: E402
from sparse_mla.args import PrefillArgs  # noqa: E402
from sparse_mla.jit import env  # noqa: E402
from sparse_mla.testing import PRESETS, load_module, make_inputs, poisoned_outputs, realistic_indices  # noqa: E402

roots = dict(a.split("=") for a in sys.argv[1:])
mods = {n: load_module(next(pathlib.Path(r).glob(f"sm90a/sparse_mla_prefill_dqk{D_QK}_topk{TOPK}_sm90a/*/*.so")))
        for n, r in roots.items()}
print(torch.cuda.get_device_name(), flush=True)
cycles = sleep_cycles_for(2.0)
for row in ROWS:
    a = make_inputs(row.s_q, row.s_kv, row.h_q, D_QK, TOPK, seed=0)
    a["indices"] = realistic_indices(row.s_q, row.s_kv, TOPK, **PRESETS["realistic-glm"], seed=0)
    os.environ["SPARSE_MLA_TOKEN_GROUPS"] = row.token_groups
    plan = L.plan_on(0, row.s_q, row.h_q, TOPK, row.batch_invariant, env.token_groups())
    outs = {n: poisoned_outputs(row.s_q, row.h_q, D_V) for n in mods}
    calls = {}
    for n, m in mods.items():
        o = outs[n]
        args = PrefillArgs(a["q"], a["kv"], a["indices"], a["q_scale"], a["kv_scale"], None, None, o["out"],
                           o["max_logits"], o["lse"], float(a["sm_scale"]), row.batch_invariant)
        calls[n] = (lambda f=getattr(m, plan.entry), args=args: L.execute(plan, f, args))
    cells = []
    for _ in range(2):
        for n, call in calls.items():
            t = host_times(call, 50, cycles)
            cells.append(f"{n} {t['idle_us']:5.1f}/{t['queued_us']:5.1f} ({t['returned_before_work_ended']:.2f})")
    torch.cuda.synchronize()
    base = next(iter(mods))
    same = all(torch.equal(outs[n][k].view(torch.uint8), outs[base][k].view(torch.uint8)) for n in mods
               for k in ("out", "max_logits", "lse"))
    print(f"{row.path:<24}{row.s_q:>5}{row.s_kv:>7}{row.h_q:>4} {plan.entry:<26}| " + " | ".join(cells)
          + f" | bitwise {same}", flush=True)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS", None)

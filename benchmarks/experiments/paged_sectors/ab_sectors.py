"""Experiment 141 A/B: paged builds (cache roots) side by side with the contiguous kernel on the engines' pass output; outputs compared bitwise with the first build's."""
import pathlib, sys
sys.path.insert(0, "benchmarks")  # run from the repository root; argv: NAME=CACHE_ROOT ... (the first is the baseline)
import torch
from prefix_hit import Batch, TOPK, D_QK
from engine_pass import engine_pass
from sparse_mla import launch as L, sparse_mla_q8kv8_prefill_fwd
from sparse_mla.args import PrefillArgs
from sparse_mla.testing import load_module, interleaved_median_ms, quantize_fp8, poisoned_outputs, relative_error

roots = dict(a.split("=") for a in sys.argv[1:])
mods = {n: load_module(next(pathlib.Path(r).glob("sm90a/sparse_mla_prefill_dqk576_topk2048_sm90a/*/*.so"))) for n, r in roots.items()}
print(torch.cuda.get_device_name())
for (s_q, ctx, h_q) in [(16, 131072, 128), (16, 131072, 16), (64, 32768, 16), (64, 32768, 128), (256, 32768, 16), (1024, 32768, 128), (4096, 32768, 16)]:
    batch = Batch(1, ctx, 0)
    bi, pi = batch.indices(s_q, 0)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, q_scale = quantize_fp8(0.2 * torch.randn(s_q, h_q, D_QK, device="cuda", generator=g))
    kv = engine_pass(batch.cache, batch.rows, TOPK)
    kv_scale = torch.ones(1, dtype=torch.float32, device="cuda")
    sm = D_QK ** -0.5
    co = poisoned_outputs(s_q, h_q, 512)
    plan = L._through_paged_entries(L.plan_on(0, s_q, h_q, TOPK, False, "auto"))
    calls = {"contig": lambda: sparse_mla_q8kv8_prefill_fwd(q, kv, bi, sm, q_scale, kv_scale, **co)}
    outs = {}
    for n, m in mods.items():
        o = poisoned_outputs(s_q, h_q, 512); outs[n] = o
        args = PrefillArgs(q, batch.cache, pi, q_scale, None, None, None, o["out"], o["max_logits"], o["lse"], sm, False)
        f = getattr(m, plan.entry)
        calls[n] = (lambda f=f, args=args: L.execute(plan, f, args))
    t = interleaved_median_ms(calls, iters=40)
    for c in calls.values(): c()
    torch.cuda.synchronize()
    base = next(iter(mods))
    errs = " ".join(f"{n}:{'bitwise' if all(torch.equal(outs[n][k], outs[base][k]) for k in ('out', 'max_logits', 'lse')) else 'DIFFER %.1e' % relative_error(outs[n]['out'], outs[base]['out'])}" for n in mods)
    print(f"{s_q:>5} {ctx:>6} h{h_q:<3} {plan.entry:<34} " + " ".join(f"{n} {ms*1e3:7.1f}" for n, ms in t.items()) + f" | vs {base}: {errs}", flush=True)
    del batch, kv

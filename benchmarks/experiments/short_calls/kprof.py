"""Probe: per-kernel GPU durations and the span of one short call (torch.profiler), auto/never, h_q 16/128."""
import os, sys
sys.path.insert(0, "benchmarks")
import torch
from common import pattern_indices
from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import make_inputs, poisoned_outputs
from torch.profiler import profile, ProfilerActivity

for s_q, s_kv, h_q in [(16, 32768, 16), (64, 32768, 16), (16, 32768, 128), (64, 32768, 128), (256, 32768, 16)]:
    inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
    inputs["indices"] = pattern_indices("realistic-glm", s_q, s_kv, 2048, 0, inputs["indices"])
    outputs = poisoned_outputs(s_q, h_q, 512)
    for mode in ("auto", "never"):
        os.environ["SPARSE_MLA_TOKEN_GROUPS"] = mode
        for _ in range(5): sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
                torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        per = {}
        for e in evs:
            per.setdefault(e.name[:60], []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        desc = "; ".join(f"{k}: {sorted(v)[len(v)//2]:.1f}us x{len(v)//10}" for k, v in per.items())
        print(f"{s_q:>4} {s_kv} {h_q:>3} {mode:<5} | {desc}", flush=True)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS")

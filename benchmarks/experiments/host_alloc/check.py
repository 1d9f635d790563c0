"""GPU check of outputs and scratch allocated in the entry: every path, bitwise against preallocated
outputs, a CUDA graph with library-allocated outputs, a side stream."""
import os, torch
from sparse_mla import sparse_mla_q8kv8_prefill_fwd as f
from sparse_mla.testing import make_inputs, poisoned_outputs, realistic_indices, PRESETS, reference_prefill, relative_error
bad = 0
for s_q, s_kv, h_q, tg in [(300, 8192, 64, "auto"), (437, 8192, 64, "auto"), (16, 32768, 16, "auto"), (512, 8192, 16, "auto"), (300, 8192, 8, "always"), (200, 8192, 128, "never")]:
    os.environ["SPARSE_MLA_TOKEN_GROUPS"] = tg
    a = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=1)
    a["indices"] = realistic_indices(s_q, s_kv, 2048, **PRESETS["realistic-glm"], seed=1)
    o = poisoned_outputs(s_q, h_q, 512)
    pre = f(**a, **o)
    lib = f(**a)
    same = all(torch.equal(x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32), y.view(torch.int16 if y.dtype == torch.bfloat16 else torch.int32)) for x, y in zip(pre, lib))
    ref = reference_prefill(a["q"][:8], a["kv"], a["indices"][:8], a["sm_scale"], a["q_scale"], a["kv_scale"])
    err = relative_error(lib[0][:8], ref[0])
    print(s_q, s_kv, h_q, tg, "bitwise same as preallocated:", same, "err", f"{err:.2e}", [tuple(t.shape) for t in lib], flush=True)
    bad += (not same) or not (err < 3e-2)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS")
# CUDA graph, library-allocated outputs
a = make_inputs(437, 8192, 64, 576, 2048, seed=2)
expected = f(**a)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    f(**a)
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    got = f(**a)
for t in got: t.fill_(float("nan"))
g.replay(); torch.cuda.synchronize()
same = all(torch.equal(x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32), y.view(torch.int16 if y.dtype == torch.bfloat16 else torch.int32)) for x, y in zip(expected, got))
print("graph replay same:", same); bad += not same
# side stream
with torch.cuda.stream(s):
    side = f(**a)
torch.cuda.synchronize()
same = all(torch.equal(x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32), y.view(torch.int16 if y.dtype == torch.bfloat16 else torch.int32)) for x, y in zip(expected, side))
print("side stream same:", same); bad += not same
print("BAD", bad)

"""Probe: short calls at few heads split into 8 parts (a build with MAX_SPLIT_PARTS 8) against today's plans."""
import glob, json, os, sys
sys.path.insert(0, "benchmarks")
import torch
import tvm_ffi
from common import pattern_indices
from tp import padded_incumbent_call
from sparse_mla import launch, sparse_mla_q8kv8_prefill_fwd
from sparse_mla.args import PrefillArgs
from sparse_mla.testing import interleaved_median_ms, interleaved_waiting_median_ms, make_inputs, poisoned_outputs
from sparse_mla.testing.modules import load_module

dispatch = tvm_ffi.load_module(sys.argv[1])["dispatch"]
p8 = load_module(glob.glob(".abc/p8/sm90a/*576_topk2048*/*/*.so")[0])
sms = torch.cuda.get_device_properties(0).multi_processor_count
rows = []
for s_q, s_kv, h_q in [(16, 32768, 16), (32, 32768, 16), (16, 131072, 16), (16, 32768, 8), (16, 32768, 32), (8, 32768, 16), (64, 32768, 16)]:
    inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
    inputs["indices"] = pattern_indices("realistic-glm", s_q, s_kv, 2048, 0, inputs["indices"])
    o = poisoned_outputs(s_q, h_q, 512)
    args = PrefillArgs(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, None,
                       o["out"], o["max_logits"], o["lse"], inputs["sm_scale"], False)
    def api(mode):
        def call():
            os.environ["SPARSE_MLA_TOKEN_GROUPS"] = mode
            sparse_mla_q8kv8_prefill_fwd(**inputs, **o)
        return call
    def parts(n):
        plan = launch.Plan("prefill_split_fwd", ("wide",), 0, n, 1, 0.0)
        fn = getattr(p8, plan.entry)
        return lambda: launch.execute(plan, fn, args)
    calls = {"auto": api("auto"), "never": api("never"), "p2": parts(2), "p4": parts(4), "p8": parts(8),
             "incumbent": padded_incumbent_call(dispatch, inputs, s_kv)}
    calls = {k: v for k, v in calls.items() if v is not None}
    # check p8 against never's outputs
    api("never")(); ref = o["out"].clone(); parts(8)(); torch.cuda.synchronize()
    err = (o["out"].float() - ref.float()).abs().max().item()
    gpu = interleaved_median_ms(calls, iters=40)
    wait = interleaved_waiting_median_ms(calls, iters=30)
    rows.append(dict(s_q=s_q, s_kv=s_kv, h_q=h_q, gpu_us={k: v * 1e3 for k, v in gpu.items()}, wait_us={k: v * 1e3 for k, v in wait.items()}, p8_vs_never_maxdiff=err))
    print(f"{s_q:>4} {s_kv:>6} {h_q:>3} | gpu " + " ".join(f"{k} {v*1e3:6.1f}" for k, v in gpu.items()) + " | wait " + " ".join(f"{k} {v*1e3:6.1f}" for k, v in wait.items()) + f" | p8-never {err:.3g}", flush=True)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS")
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "split8.json"), "w"), indent=1)

"""Probe: short calls at few heads; token groups auto vs never (never: the wide tail split) vs the padded incumbent."""
import json, os, sys
sys.path.insert(0, "benchmarks")
import torch
import tvm_ffi
from common import pattern_indices
from tp import padded_incumbent_call
from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.launch import plan
from sparse_mla.testing import interleaved_median_ms, interleaved_waiting_median_ms, make_inputs, poisoned_outputs

dispatch = tvm_ffi.load_module(sys.argv[1])["dispatch"]
SHAPES = [(16, 32768, 16), (64, 32768, 16), (128, 32768, 16), (132, 32768, 16), (256, 32768, 16), (128, 131072, 8), (128, 32768, 32), (16, 131072, 16), (64, 131072, 16),
          (16, 32768, 8), (64, 32768, 8), (16, 32768, 32), (16, 32768, 128), (64, 32768, 128)]
rows = []
for s_q, s_kv, h_q in SHAPES:
    inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
    inputs["indices"] = pattern_indices("realistic-glm", s_q, s_kv, 2048, 0, inputs["indices"])
    outputs = poisoned_outputs(s_q, h_q, 512)

    def ours(mode):
        def call():
            os.environ["SPARSE_MLA_TOKEN_GROUPS"] = mode
            sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
        return call
    calls = {"auto": ours("auto"), "never": ours("never"), "incumbent": padded_incumbent_call(dispatch, inputs, s_kv)}
    gpu = interleaved_median_ms(calls, iters=40)
    wait = interleaved_waiting_median_ms(calls, iters=40)
    plans = {m: plan(s_q, h_q, 2048, 132, False, m) for m in ("auto", "never")}
    row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, gpu_us={k: v * 1e3 for k, v in gpu.items()},
               wait_us={k: v * 1e3 for k, v in wait.items()}, plans={k: [p.entry, p.tiles, p.split_parts, p.group_size] for k, p in plans.items()})
    rows.append(row)
    print(f"{s_q:>5} {s_kv:>6} {h_q:>4} | gpu us auto {gpu['auto']*1e3:6.1f} never {gpu['never']*1e3:6.1f} inc {gpu['incumbent']*1e3:6.1f}"
          f" | wait us auto {wait['auto']*1e3:6.1f} never {wait['never']*1e3:6.1f} inc {wait['incumbent']*1e3:6.1f} | {plans['never'].entry} {plans['never'].split_parts}", flush=True)
os.environ.pop("SPARSE_MLA_TOKEN_GROUPS")
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "short.json"), "w"), indent=1)

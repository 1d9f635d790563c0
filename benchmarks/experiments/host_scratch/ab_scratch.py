"""Experiment 140 A/B in one process (run from the patched tree): a split or grouped call's scratch allocated in Python (before) or by the entry (after)."""
import os, sys, torch
sys.path.insert(0, "benchmarks")
from overhead import ROWS, host_times, sleep_cycles_for, D_QK, TOPK, D_V
from sparse_mla import launch, sparse_mla_q8kv8_prefill_fwd, sparse_mla_q8kv8_paged_prefill_fwd
from sparse_mla.args import ENTRY_ARGS
from sparse_mla.testing import make_inputs, realistic_indices, PRESETS, poisoned_outputs, as_paged_call
entry_alloc = launch.execute
def python_alloc(call_plan, function, args):
    entry_args = args[:ENTRY_ARGS] if args.kv_scale is not None else (*args[:4], *args[5:ENTRY_ARGS])
    if call_plan.scratch_bytes == 0:
        function(*entry_args); return
    scratch = args.q.new_empty((call_plan.scratch_bytes,), dtype=torch.uint8)
    if call_plan.group_size > 1: function(*entry_args, call_plan.group_size, call_plan.max_union_ratio, scratch)
    else: function(*entry_args, call_plan.split_begin, call_plan.split_parts, scratch)
print(torch.cuda.get_device_name())
cycles = sleep_cycles_for(2.0)
for row in ROWS:
    if row.path not in ("split", "grouped"): continue
    inputs = make_inputs(row.s_q, row.s_kv, row.h_q, D_QK, TOPK, seed=0)
    inputs["indices"] = realistic_indices(row.s_q, row.s_kv, TOPK, **PRESETS["realistic-glm"], seed=0)
    os.environ["SPARSE_MLA_TOKEN_GROUPS"] = row.token_groups
    outs = poisoned_outputs(row.s_q, row.h_q, D_V)
    ref = None
    cells = []
    for name, ex in (("python", python_alloc), ("entry", entry_alloc), ("python", python_alloc), ("entry", entry_alloc)):
        launch.execute = ex
        t = host_times(lambda: sparse_mla_q8kv8_prefill_fwd(**inputs), 50, cycles)
        tp = host_times(lambda: sparse_mla_q8kv8_prefill_fwd(**inputs, **outs), 50, cycles)
        got = sparse_mla_q8kv8_prefill_fwd(**inputs)
        torch.cuda.synchronize()
        same = ref is None or all(torch.equal(a, b) for a, b in zip(got, ref))
        ref = ref or got
        cells.append(f"{name} {t['idle_us']:5.1f}/{t['queued_us']:5.1f} pre {tp['idle_us']:5.1f}/{tp['queued_us']:5.1f} early {t['returned_before_work_ended']:.2f} eq {same}")
    launch.execute = entry_alloc
    del os.environ["SPARSE_MLA_TOKEN_GROUPS"]
    print(f"{row.path:<8}{row.s_q:>5}{row.s_kv:>7}{row.h_q:>4} | " + " | ".join(cells), flush=True)

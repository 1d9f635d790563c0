"""Probe (CPU): the out error of candidate schemes for reading the 656-byte paged cache, against the
float64 reference over the dequantized cache. Logits exact (float64), P rounded as each scheme would."""
import torch
from sparse_mla.testing import PRESETS, quantize_fp8, random_latent, realistic_indices
from sparse_mla.testing.paged_cache import quantize_paged_cache, dequantize_paged_cache

torch.manual_seed(0)
E4 = torch.float8_e4m3fn
def e4(x):  # round to e4m3, saturating
    return x.clamp(-448, 448).float().to(E4).double()

def run(ctx=8192, s_q=16, h_q=16, spread=10, q_sigma=0.2, seed=0):
    lat = random_latent(ctx, 576, tile_spread_log2=spread, seed=seed)
    cache = quantize_paged_cache(lat, 64)
    rows = cache.view(torch.uint8).reshape(-1, 656)[:ctx]
    codes = rows[:, :512].contiguous().view(E4).double()                       # [ctx, 512] e4m3 values
    scales = rows[:, 512:528].contiguous().view(torch.float32).double()        # [ctx, 4]
    rope = rows[:, 528:].contiguous().view(torch.bfloat16).double()            # [ctx, 64]
    s_tile = scales.repeat_interleave(128, dim=1)                             # [ctx, 512]
    nope = codes * s_tile                                                      # exact dequantized
    exact = torch.cat([nope, rope], 1)
    g = torch.Generator().manual_seed(seed)
    q8, qs = quantize_fp8(q_sigma * torch.randn(s_q, h_q, 576, generator=g))
    q = q8.double() * qs.double()
    idx = realistic_indices(s_q, ctx, 2048, **PRESETS["realistic-glm"], seed=seed, device="cpu")[:, 0].long()
    sm = 576 ** -0.5

    def attend(K, V, p_round):
        out = torch.empty(s_q, h_q, 512, dtype=torch.float64)
        for t in range(s_q):
            sel = idx[t][idx[t] >= 0]
            s = sm * q[t] @ K[sel].T                       # [h, n]
            p = torch.exp(s - s.amax(-1, keepdim=True))
            out[t] = (p_round(p) @ V[sel, :512]) / p.sum(-1, keepdim=True)
        return out.to(torch.bfloat16).double()

    ref = attend(exact, exact, lambda p: p)
    def err(o): return (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item()
    s_row = scales.amax(1, keepdim=True).repeat_interleave(512, 1)
    row_rq = e4(nope / s_row) * s_row                                           # per-row requantized nope
    engine = torch.cat([e4(nope), e4(rope)], 1)
    bf = lambda x: x.to(torch.bfloat16).double()
    sigma = scales.max()
    t_rq = torch.cat([e4(nope / sigma), e4(rope / sigma)], 1) * sigma            # one scale for the call
    sel_rows = idx[idx >= 0].unique()
    sigma_sel = scales[sel_rows].max()
    t_rq_sel = torch.cat([e4(nope / sigma_sel), e4(rope / sigma_sel)], 1) * sigma_sel
    res = {
        "P e4m3 only (exact scales, rope bf16)": err(attend(exact, exact, e4)),
        "exact nope, rope e4m3": err(attend(torch.cat([nope, e4(rope)], 1), exact, e4)),
        "row-requant nope, rope bf16": err(attend(torch.cat([row_rq, rope], 1), torch.cat([row_rq, rope], 1), e4)),
        "row-requant nope, rope e4m3": err(attend(torch.cat([row_rq, e4(rope)], 1), torch.cat([row_rq, rope], 1), e4)),
        "engine (scale 1.0, rope e4m3)": err(attend(engine, engine, e4)),
        "bf16 dequant K,V and bf16 P": err(attend(bf(exact), bf(exact), bf)),
        "one scale (max of all), rope e4m3": err(attend(t_rq, t_rq, e4)),
        "one scale (max of selected rows)": err(attend(t_rq_sel, t_rq_sel, e4)),
    }
    return res

for spread in (10, 8, 4, 0):
    r = run(spread=spread)
    print(f"tile spread 2^{spread}: " + "; ".join(f"{k} {v:.2e}" for k, v in r.items()), flush=True)

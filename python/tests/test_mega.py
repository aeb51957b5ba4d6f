"""The single-process Mega MoE references (CPU extras) against the unfused chain in PyTorch."""
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp8, per_token_cast_to_fp4
from conftest import calc_diff, fp4_dequant


def moe_ref(xs, idx, wts, w1, w2, num_experts, quant_act):
    R = len(xs)
    epr = num_experts // R
    ys = []
    for s in range(R):
        y = torch.zeros(xs[s].shape[0], xs[s].shape[1])
        for t in range(xs[s].shape[0]):
            for j in range(idx[s].shape[1]):
                e = int(idx[s][t, j])
                if e < 0:
                    continue
                W1, W2 = w1[e // epr][e % epr], w2[e // epr][e % epr]
                h = (xs[s][t] @ W1.t()).bfloat16().float()
                i = h.numel() // 2
                gate, up = h[:i], h[i:]
                a = gate / (1 + torch.exp(-gate)) * up * wts[s][t, j]
                a = quant_act(a)
                y[t] += (a @ W2.t()).bfloat16().float()
        ys.append(y.bfloat16())
    return ys


def inputs(R=2, E=4, T=(3, 2), H=64, I=32, K=2):
    xs = [torch.randn(t, H).bfloat16() for t in T]
    idx = [torch.randint(-1, E, (t, K), dtype=torch.int64) for t in T]
    wts = [torch.rand(t, K) for t in T]
    w1 = [torch.randn(E // R, 2 * I, H).bfloat16() / 8 for _ in range(R)]
    w2 = [torch.randn(E // R, H, I).bfloat16() / 8 for _ in range(R)]
    return xs, idx, wts, w1, w2


def test_bf16_mega_moe_reference():
    xs, idx, wts, w1, w2 = inputs()
    ys = [torch.empty_like(x) for x in xs]
    stats = [torch.zeros(2, dtype=torch.int32) for _ in range(2)]
    dg.bf16_mega_moe_reference(4, xs, idx, wts, w1, w2, ys, cumulative_local_expert_recv_stats=stats)
    ref = moe_ref([x.float() for x in xs], idx, wts, [w.float() for w in w1], [w.float() for w in w2], 4,
                  lambda a: a.bfloat16().float())
    for y, r in zip(ys, ref):
        assert calc_diff(y, r) < 1e-4
    counts = torch.bincount(torch.cat([i.flatten() for i in idx]).clamp(min=-1) + 1, minlength=5)[1:]
    assert torch.equal(torch.cat(stats), counts.int())


def test_fp8_fp4_mega_moe_reference():
    xs, idx, wts, w1, w2 = inputs()
    H, I = 64, 32
    xq = [per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32) for x in xs]
    def q4(w):  # [E/R, rows, cols] -> packed FP4 with float32 per-32 UE8M0 scales
        e, r, c = w.shape
        q, sf = per_token_cast_to_fp4(w.reshape(e * r, c).float(), use_ue8m0=True, gran_k=32)
        return q.view(e, r, c // 2), sf.view(e, r, -1)
    w1q, w2q = [q4(w) for w in w1], [q4(w) for w in w2]
    ys = [torch.empty_like(x) for x in xs]
    dg.fp8_fp4_mega_moe_reference(4, xq, idx, wts, w1q, w2q, ys)
    deq = lambda q, sf: fp4_dequant(q.reshape(-1, q.shape[-1]), sf.reshape(-1, sf.shape[-1]), 32).view(
        q.shape[0], q.shape[1], -1)
    ref = moe_ref([q.float() * s.repeat_interleave(32, 1) for q, s in xq], idx, wts,
                  [deq(*w) for w in w1q], [deq(*w) for w in w2q], 4, lambda a: a)
    for y, r in zip(ys, ref):
        assert calc_diff(y, r) < 1e-3

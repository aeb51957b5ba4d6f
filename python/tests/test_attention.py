"""MQA logits (plain and paged) against float32 PyTorch math with DeepGEMM's thresholds
(FP8 1e-3, FP4 0.02); the functions return new logits tensors, as DeepGEMM's do."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_custom_dims_cast_to_fp8, per_token_cast_to_fp4
from conftest import calc_diff, fp4_dequant


def fp4_pack(x, d):
    """x [..., d] -> packed int8 [..., d/2], int32 scales [...] (UE8M0 per 32, packed)."""
    lead = x.shape[:-1]
    q, sf = per_token_cast_to_fp4(x.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    return q.view(*lead, d // 2), sf.view(*lead)


def fp4_unpack(q, sf, d):
    lead = q.shape[:-1]
    return fp4_dequant(q.reshape(-1, d // 2), sf.reshape(-1, 1), 32, packed_sf=True).view(*lead, d)


def ref_logits(q, kv, w, ks, ke):
    s = torch.einsum('shd,td->sht', q, kv).relu()
    logits = (s * w.unsqueeze(-1)).sum(1)
    pos = torch.arange(kv.size(0))
    visible = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
    return logits.masked_fill(~visible, float('-inf')), visible


@pytest.mark.parametrize('fp4', [False, True])
@pytest.mark.parametrize('logits_dtype', [torch.float32, torch.bfloat16])
def test_mqa_logits(fp4, logits_dtype):
    s, sk, h, d = 9, 300, 8, 128
    q = torch.randn(s, h, d)
    kv = torch.randn(sk, d)
    w = torch.randn(s, h)
    ks = torch.randint(0, 50, (s,), dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(1, 260, (s,), dtype=torch.int32), torch.tensor(sk, dtype=torch.int32))
    if fp4:
        qq, qsf = fp4_pack(q, d)
        kq, ksf = fp4_pack(kv, d)
        qd, kd = fp4_unpack(qq, qsf, d), fp4_unpack(kq, ksf, d)
        q_arg = (qq, qsf)
    else:
        qq = q.to(torch.float8_e4m3fn)
        kq, ksf = per_custom_dims_cast_to_fp8(kv, (0,), False)
        qd, kd = qq.float(), kq.float() * ksf[:, None]
        q_arg = (qq, None)
    ref, visible = ref_logits(qd, kd, w, ks.long(), ke.long())
    weights = w if logits_dtype == torch.float32 else w
    logits = dg.fp8_fp4_mqa_logits(q_arg, (kq, ksf), weights, ks, ke, logits_dtype=logits_dtype)
    assert logits.shape == (s, sk) and logits.dtype == logits_dtype
    assert logits.stride(0) % (1024 // logits.element_size()) == 0  # DeepGEMM's padded rows
    assert calc_diff(logits[visible], ref[visible]) < (0.02 if fp4 else 1e-3)
    assert (logits[~visible] == float('-inf')).all()
    if not fp4:
        legacy = dg.fp8_mqa_logits(qq, (kq, ksf), w, ks, ke)
        assert legacy.dtype == torch.float32
        assert calc_diff(legacy[visible], ref[visible]) < 1e-3


def build_paged_cache(kv, block_kv):
    """kv [num_blocks * block_kv, D] -> DeepGEMM's fused FP8 cache uint8 [blocks, block_kv, 1, D + 4]."""
    n, d = kv.shape
    nb = n // block_kv
    q, sf = per_custom_dims_cast_to_fp8(kv, (0,), False)
    buf = torch.empty(nb, block_kv * (d + 4), dtype=torch.uint8)
    buf[:, :block_kv * d] = q.view(torch.uint8).view(nb, block_kv * d)
    buf[:, block_kv * d:] = sf.contiguous().view(torch.uint8).view(nb, block_kv * 4)
    return buf.view(nb, block_kv, 1, d + 4), q.float() * sf[:, None]


@pytest.mark.parametrize('next_n', [1, 2])
def test_paged_mqa_logits(next_n):
    b, h, d, block_kv, max_blocks = 3, 8, 64, 64, 4
    num_blocks = b * max_blocks
    kv = torch.randn(num_blocks * block_kv, d)
    cache, kv_deq = build_paged_cache(kv, block_kv)
    block_table = torch.randperm(num_blocks, dtype=torch.int32).view(b, max_blocks)
    context_lens = torch.tensor([5, 200, 256], dtype=torch.int32)
    max_len = 256
    q = torch.randn(b, next_n, h, d).to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, h)
    meta = dg.get_paged_mqa_logits_metadata(context_lens, block_kv, dg.get_num_sms())
    assert meta.dtype == torch.int32 and meta.shape == (dg.get_num_sms() + 1, 2)
    logits = dg.fp8_paged_mqa_logits(q, cache, w, context_lens, block_table, meta, max_len, clean_logits=True)
    logits2 = dg.fp8_fp4_paged_mqa_logits((q, None), cache, w, context_lens, block_table, meta, max_len,
                                          clean_logits=True, logits_dtype=torch.float32)
    assert torch.equal(logits, logits2) and logits.shape == (b * next_n, max_len)
    for bi in range(b):
        ctx = int(context_lens[bi])
        rows = torch.cat([kv_deq[int(blk) * block_kv:(int(blk) + 1) * block_kv] for blk in block_table[bi]])
        for t in range(next_n):
            r = bi * next_n + t
            vis = ctx - next_n + t + 1
            s = torch.einsum('hd,pd->hp', q[bi, t].float(), rows[:vis]).relu()
            ref = (s * w[r][:, None]).sum(0)
            assert calc_diff(logits[r, :vis], ref) < 1e-3
            assert (logits[r, vis:] == float('-inf')).all()


def test_fp4_paged_mqa_logits():
    b, next_n, h, d, block_kv, max_blocks = 2, 1, 8, 64, 32, 3
    nb = b * max_blocks
    kv = torch.randn(nb * block_kv, d)
    kq, ksf = fp4_pack(kv, d)
    kv_deq = fp4_unpack(kq, ksf, d)
    buf = torch.empty(nb, block_kv * (d // 2 + 4), dtype=torch.uint8)
    buf[:, :block_kv * d // 2] = kq.view(torch.uint8).reshape(nb, -1)
    buf[:, block_kv * d // 2:] = ksf.contiguous().view(torch.uint8).reshape(nb, -1)
    cache = buf.view(nb, block_kv, 1, d // 2 + 4)
    q, qsf = fp4_pack(torch.randn(b, next_n, h, d), d)
    q_deq = fp4_unpack(q, qsf, d)
    w = torch.randn(b * next_n, h)
    table = torch.arange(nb, dtype=torch.int32).flip(0).view(b, max_blocks)
    lens = torch.tensor([40, 96], dtype=torch.int32)
    meta = dg.get_paged_mqa_logits_metadata(lens, block_kv, dg.get_num_sms())
    logits = dg.fp8_fp4_paged_mqa_logits((q, qsf), cache, w, lens, table, meta, 96, clean_logits=True)
    for bi in range(b):
        rows = torch.cat([kv_deq[int(k) * block_kv:(int(k) + 1) * block_kv] for k in table[bi]])
        n = int(lens[bi])
        ref = (torch.einsum('hd,pd->hp', q_deq[bi, 0], rows[:n]).relu() * w[bi][:, None]).sum(0)
        assert calc_diff(logits[bi, :n], ref) < 0.02
        assert (logits[bi, n:] == float('-inf')).all()


@pytest.mark.parametrize('legacy', [False, True])
def test_mqa_logits_max_seqlen_k(legacy):
    """DeepGEMM's max_seqlen_k > 0: logits [S, max_seqlen_k], column c holding kv row ks[i] + c
    (regression: the legacy form raised SystemError for this keyword, issue 17)."""
    s, sk, h, d, width = 6, 200, 4, 64, 64
    q = torch.randn(s, h, d).to(torch.float8_e4m3fn)
    kv, kv_sf = per_custom_dims_cast_to_fp8(torch.randn(sk, d), (0,), False)
    w = torch.randn(s, h)
    ks = torch.randint(0, 120, (s,), dtype=torch.int32)
    ke = ks + torch.randint(1, width + 1, (s,), dtype=torch.int32)
    full = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, ks, ke, clean_logits=False)
    if legacy:
        by_keyword = dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=False, max_seqlen_k=width)
        by_position = dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, False, width)
    else:
        by_keyword = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, ks, ke, clean_logits=False,
                                           max_seqlen_k=width)
        by_position = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, ks, ke, False, width, torch.float32)
    for logits in (by_keyword, by_position):
        assert logits.shape == (s, width) and logits.dtype == torch.float32
        assert logits.stride(0) % 256 == 0  # align(align(max_seqlen_k, 256), 1024 bytes)
        for i in range(s):
            n = int(ke[i] - ks[i])
            assert torch.equal(logits[i, :n], full[i, int(ks[i]):int(ke[i])])
    with pytest.raises(ValueError, match="'max_seqlen_k'"):
        dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, max_seqlen_k=-1)
    with pytest.raises(TypeError, match='logits_dtype'):
        dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, logits_dtype=torch.float32)  # not in the legacy form

"""MQA logits (plain and paged) against float32 PyTorch math with DeepGEMM's thresholds
(FP8 1e-3, MXFP4 and MXFP8 0.02); the functions return new logits tensors, as DeepGEMM's do."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import (per_custom_dims_cast_to_fp8, per_token_cast_to_fp4, per_token_cast_to_fp8,
                                 cast_back_from_fp8)
from conftest import calc_diff, fp4_dequant


def fp4_pack(x, d):
    """x [..., d] -> packed int8 [..., d/2], int32 scales [...] (UE8M0 per 32, packed)."""
    lead = x.shape[:-1]
    q, sf = per_token_cast_to_fp4(x.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    return q.view(*lead, d // 2), sf.view(*lead)


def fp4_unpack(q, sf, d):
    lead = q.shape[:-1]
    return fp4_dequant(q.reshape(-1, d // 2), sf.reshape(-1, 1), 32, packed_sf=True).view(*lead, d)


def mxfp8_pack(x, d):
    """x [..., d] -> E4M3 [..., d], int32 scales [...] (UE8M0 per 32, packed), as DeepGEMM 2.8's
    test_attention casts MXFP8; also the dequantized values."""
    lead = x.shape[:-1]
    q, sf = per_token_cast_to_fp8(x.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    deq = cast_back_from_fp8(q, sf, gran_k=32, use_packed_ue8m0=True)
    return q.view(*lead, d), sf.view(*lead), deq.view(*lead, d)


def ref_logits(q, kv, w, ks, ke):
    s = torch.einsum('shd,td->sht', q, kv).relu()
    logits = (s * w.unsqueeze(-1)).sum(1)
    pos = torch.arange(kv.size(0))
    visible = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
    return logits.masked_fill(~visible, float('-inf')), visible


@pytest.mark.parametrize('fmt', ['fp8', 'mxfp4', 'mxfp8'])
@pytest.mark.parametrize('logits_dtype', [torch.float32, torch.bfloat16])
def test_mqa_logits(fmt, logits_dtype):
    s, sk, h, d = 9, 300, 8, 128
    q = torch.randn(s, h, d)
    kv = torch.randn(sk, d)
    w = torch.randn(s, h)
    ks = torch.randint(0, 50, (s,), dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(1, 260, (s,), dtype=torch.int32), torch.tensor(sk, dtype=torch.int32))
    if fmt == 'mxfp4':
        qq, qsf = fp4_pack(q, d)
        kq, ksf = fp4_pack(kv, d)
        qd, kd = fp4_unpack(qq, qsf, d), fp4_unpack(kq, ksf, d)
        q_arg = (qq, qsf)
    elif fmt == 'mxfp8':
        qq, qsf, qd = mxfp8_pack(q, d)
        kq, ksf, kd = mxfp8_pack(kv, d)
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
    # DeepGEMM 2.8's thresholds: against the dequantized inputs (its "simulated" reference) and,
    # for the MX formats, 0.02 against the unquantized ones
    assert calc_diff(logits[visible], ref[visible]) < (3e-5 if logits_dtype == torch.bfloat16 else 5e-6)
    if fmt != 'fp8':
        exact, _ = ref_logits(q, kv, w, ks.long(), ke.long())
        assert calc_diff(logits[visible], exact[visible]) < 0.02
    assert (logits[~visible] == float('-inf')).all()
    if fmt == 'fp8':
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


def to_mqa_weights(w, dtype):
    """w in `dtype` with rows padded to 16 bytes, as DeepGEMM 2.8's test_attention lays them out."""
    elem = torch.empty((), dtype=dtype).element_size()
    stride = -(-w.size(1) * elem // 16) * 16 // elem
    out = torch.empty((w.size(0), stride), dtype=dtype)[:, :w.size(1)]
    out.copy_(w)
    return out


@pytest.mark.parametrize('fmt', ['fp8', 'mxfp4'])
def test_mqa_logits_float16_weights(fmt):
    """DeepGEMM 2.8's float16 weights: the logits of float32 weights of the same values, bit for
    bit, with either logits dtype (plain and paged forms)."""
    s, sk, h, d = 12, 200, 12, 64
    q, kv = torch.randn(s, h, d), torch.randn(sk, d)
    if fmt == 'mxfp4':
        q_arg, kv_arg = fp4_pack(q, d), fp4_pack(kv, d)
    else:
        q_arg, kv_arg = (q.to(torch.float8_e4m3fn), None), per_custom_dims_cast_to_fp8(kv, (0,), False)
    w16 = to_mqa_weights(torch.randn(s, h) * 0.1, torch.float16)
    assert not w16.is_contiguous()
    ks = torch.randint(0, 50, (s,), dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(1, 160, (s,), dtype=torch.int32), torch.tensor(sk, dtype=torch.int32))
    for logits_dtype in (torch.float32, torch.bfloat16):
        got = dg.fp8_fp4_mqa_logits(q_arg, kv_arg, w16, ks, ke, logits_dtype=logits_dtype)
        want = dg.fp8_fp4_mqa_logits(q_arg, kv_arg, w16.float(), ks, ke, logits_dtype=logits_dtype)
        assert got.dtype == logits_dtype and torch.equal(got, want)
    # paged: FP8 cache, contiguous float16 weights
    b, block_kv, max_blocks = 3, 32, 3
    cache, _ = build_paged_cache(torch.randn(b * max_blocks * block_kv, d), block_kv)
    table = torch.randperm(b * max_blocks, dtype=torch.int32).view(b, max_blocks)
    lens = torch.tensor([3, 70, 96], dtype=torch.int32)
    qp = torch.randn(b, 1, h, d).to(torch.float8_e4m3fn)
    wp = (torch.randn(b, h) * 0.1).half()
    meta = dg.get_paged_mqa_logits_metadata(lens, block_kv, dg.get_num_sms())
    for logits_dtype in (torch.float32, torch.bfloat16):
        args = ((qp, None), cache)
        got = dg.fp8_fp4_paged_mqa_logits(*args, wp, lens, table, meta, 96, clean_logits=True,
                                          logits_dtype=logits_dtype)
        want = dg.fp8_fp4_paged_mqa_logits(*args, wp.float(), lens, table, meta, 96, clean_logits=True,
                                           logits_dtype=logits_dtype)
        assert torch.equal(got, want)
    with pytest.raises(TypeError, match="'weights'"):
        dg.fp8_fp4_mqa_logits(q_arg, kv_arg, w16.double(), ks, ke)


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


def test_mxfp8_paged_mqa_logits():
    b, next_n, h, d, block_kv, max_blocks = 2, 2, 8, 64, 32, 3
    nb = b * max_blocks
    kq, ksf, kv_deq = mxfp8_pack(torch.randn(nb * block_kv, d), d)
    buf = torch.empty(nb, block_kv * (d + 4), dtype=torch.uint8)  # values, then one int32 word per token
    buf[:, :block_kv * d] = kq.view(torch.uint8).reshape(nb, -1)
    buf[:, block_kv * d:] = ksf.contiguous().view(torch.uint8).reshape(nb, -1)
    cache = buf.view(nb, block_kv, 1, d + 4)
    q, qsf, q_deq = mxfp8_pack(torch.randn(b, next_n, h, d), d)
    w = torch.randn(b * next_n, h)
    table = torch.arange(nb, dtype=torch.int32).flip(0).view(b, max_blocks)
    lens = torch.tensor([40, 96], dtype=torch.int32)
    meta = dg.get_paged_mqa_logits_metadata(lens, block_kv, dg.get_num_sms())
    logits = dg.fp8_fp4_paged_mqa_logits((q, qsf), cache, w, lens, table, meta, 96, clean_logits=True)
    for bi in range(b):
        rows = torch.cat([kv_deq[int(k) * block_kv:(int(k) + 1) * block_kv] for k in table[bi]])
        for t in range(next_n):
            n = int(lens[bi]) - next_n + t + 1
            ref = (torch.einsum('hd,pd->hp', q_deq[bi, t], rows[:n]).relu() * w[bi * next_n + t][:, None]).sum(0)
            assert calc_diff(logits[bi * next_n + t, :n], ref) < 5e-6
            assert (logits[bi * next_n + t, n:] == float('-inf')).all()


def test_cast_back_from_fp8():
    x = torch.randn(5, 96)
    q, sf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert q.dtype == torch.float8_e4m3fn and sf.dtype == torch.int32 and sf.shape == (5, 1)
    back = cast_back_from_fp8(q, sf, gran_k=32, use_packed_ue8m0=True)
    scales = (sf.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)[:, :3]  # DeepGEMM's unpack
    want = q.float() * scales.repeat_interleave(32, dim=1)
    assert back.dtype == torch.float32 and torch.equal(back, want)
    assert calc_diff(back, x) < 1e-3
    q2, sf2 = per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=64)  # float scales, a partial group
    assert torch.equal(cast_back_from_fp8(q2, sf2, 64), q2.float() * sf2.repeat_interleave(64, dim=1)[:, :96])
    with pytest.raises(ValueError, match='sf'):
        cast_back_from_fp8(q2, sf2[:, :1], 64)  # too few scale columns
    with pytest.raises(TypeError, match="'x'"):
        cast_back_from_fp8(x, sf2, 64)
    with pytest.raises(ValueError, match='gran_k'):
        cast_back_from_fp8(q2, sf2, 0)


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

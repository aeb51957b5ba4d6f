"""DeepGEMM 2.8's sparse lightning indexer and scheduled prefill, as its test_sparse_mqa_logits
checks them: sparse logits bitwise equal to the full kernel's on every scored (row, token),
self-consistent, and the scheduled fp8_fp4_mqa_logits bitwise the unscheduled one; plus calc_diff
against torch math written here (DeepGEMM's thresholds: 0.02 for MXFP4 against unquantized
inputs, 3e-5 with BF16 weights/logits against the dequantized ones), the -inf mask and errors.
Both of DeepGEMM's formats: MXFP4 and MXFP8 (E4M3 with per-32 UE8M0 scales)."""
import random

import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import (per_custom_dims_cast_to_fp8, per_token_cast_to_fp4, per_token_cast_to_fp8,
                                 cast_back_from_fp8)
from conftest import calc_diff, ceil_div, fp4_dequant

NUM_HEADS, HEAD_DIM = 32, 128  # DeepGEMM's only sparse shape


def cast_fp4(x):
    lead, d = x.shape[:-1], x.shape[-1]
    q, sf = per_token_cast_to_fp4(x.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    deq = fp4_dequant(q, sf.reshape(-1, 1), 32, packed_sf=True).view(*lead, d)
    return q.view(*lead, d // 2), sf.view(*lead), deq


def cast_mx(x, fmt):
    """MXFP4 or MXFP8 (DeepGEMM 2.8's per-32 packed UE8M0 recipe): codes, int32 words, dequantized."""
    if fmt == 'mxfp4':
        return cast_fp4(x)
    lead, d = x.shape[:-1], x.shape[-1]
    q, sf = per_token_cast_to_fp8(x.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    deq = cast_back_from_fp8(q, sf, gran_k=32, use_packed_ue8m0=True).view(*lead, d)
    return q.view(*lead, d), sf.view(*lead), deq


def make_block_indices(context_starts, context_lens, request_indices, sparse_block_kv, num_max, rng):
    """DeepGEMM's generator: each row's first blocks are sorted distinct blocks of its range (80% kept
    from the previous query of the same request), padded with the last one."""
    indices, counts, prev, prev_req = [], [], None, None
    for start, end, req in zip(context_starts, context_lens, request_indices):
        first = start // sparse_block_kv
        avail = ceil_div(max(0, end - start), sparse_block_kv)
        nb = min(avail, num_max)
        if nb == avail:
            blocks = list(range(first, first + avail))
        elif req != prev_req:
            blocks = rng.sample(range(first, first + avail), nb)
        else:
            kept = [b for b in prev if first <= b < first + avail]
            blocks = rng.sample(kept, min(round(nb * 0.8), len(kept)))
            while len(blocks) < nb:
                b = rng.randrange(first, first + avail)
                if b not in blocks:
                    blocks.append(b)
        blocks.sort()
        indices.append(blocks + [blocks[-1] if blocks else 0] * (num_max - nb))
        counts.append(nb)
        prev, prev_req = blocks, req
    return torch.tensor(indices, dtype=torch.int32), counts


def token_map(sparse_indices, counts, starts, ends, sparse_block_kv):
    """Per sparse column: its kv token and whether it is scored (DeepGEMM's valid_mask)."""
    starts_t, ends_t = torch.tensor(starts), torch.tensor(ends)
    offs = torch.arange(sparse_block_kv)
    tokens = (sparse_indices.long().unsqueeze(-1) * sparse_block_kv
              + (starts_t % sparse_block_kv)[:, None, None] + offs).flatten(1)
    valid = torch.arange(tokens.size(1))[None, :] < torch.tensor(counts)[:, None] * sparse_block_kv
    valid &= (tokens >= starts_t[:, None]) & (tokens < ends_t[:, None])
    return tokens, valid


def torch_logits(q, kv_rows, w):
    """q [S, H, D], kv_rows [S, T, D] (each row's own tokens), w [S, H] -> [S, T] in float32."""
    s = torch.einsum('shd,std->sht', q.float(), kv_rows.float()).relu()
    return (s * w.float().unsqueeze(-1)).sum(1)


def check_against_torch(logits, valid, tokens, q_raw, q_deq, kv_raw, kv_deq, w):
    idx = tokens.clamp(0, kv_raw.size(0) - 1)
    ref = torch_logits(q_raw, kv_raw[idx], w)
    sim = torch_logits(q_deq, kv_deq[idx], w)
    got = logits.float()
    assert (got[~valid] == float('-inf')).all()
    assert not torch.isinf(got[valid]).any()
    assert calc_diff(got[valid], ref[valid]) < 0.02
    assert calc_diff(got[valid], sim[valid]) < 3e-5


@pytest.mark.parametrize('fmt', ['mxfp4', 'mxfp8'])
@pytest.mark.parametrize('sparse_block_kv', [8, 16])
@pytest.mark.parametrize('use_unaligned_ks', [False, True])
def test_sparse_mqa_logits(sparse_block_kv, use_unaligned_ks, fmt):
    rng = random.Random(sparse_block_kv * 10 + use_unaligned_ks)
    num_q, avg_kv, num_max = 9, 640, 48
    ends_req = sorted(rng.sample(range(1, num_q), 2)) + [num_q]
    sizes = [e - b for b, e in zip([0] + ends_req, ends_req)]
    req_ids = [r for r, n in enumerate(sizes) for _ in range(n)]
    starts, lengths, kv_end = [], [], 0
    for n in sizes:
        start = ceil_div(kv_end, sparse_block_kv) * sparse_block_kv
        if use_unaligned_ks:
            start += rng.randrange(1, sparse_block_kv)
        starts += [start] * n
        lengths += [avg_kv + t for t in range(n)]
        kv_end = start + lengths[-1]
    ends = [a + n for a, n in zip(starts, lengths)]
    num_kv = kv_end
    q_f = torch.randn(num_q, NUM_HEADS, HEAD_DIM)
    kv_f = torch.randn(num_kv, HEAD_DIM)
    qq, qsf, q_deq = cast_mx(q_f, fmt)
    kq, ksf, kv_deq = cast_mx(kv_f, fmt)
    w = torch.randn(num_q, NUM_HEADS).to(torch.bfloat16)
    sparse_indices, counts = make_block_indices(starts, ends, req_ids, sparse_block_kv, num_max, rng)
    ks, ke = torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)
    kwargs = dict(cu_seq_len_k_start=ks, cu_seq_len_k_end=ke, num_kv_tokens=num_kv,
                  sparse_kv_block_indices=sparse_indices, qk_dtype=qq.dtype, sparse_block_kv=sparse_block_kv)
    if use_unaligned_ks:
        kwargs['use_unaligned_ks'] = True
    metadata = dg.get_sparse_mqa_logits_metadata(**kwargs)
    assert metadata.dtype == torch.uint8 and metadata.dim() == 1
    sparse_kwargs = dict(q=(qq, qsf), kv=(kq, ksf), weights=w, metadata=metadata,
                         num_max_sparse_blocks=num_max, sparse_block_kv=sparse_block_kv)
    if use_unaligned_ks:
        sparse_kwargs['use_unaligned_ks'] = True
    sparse = dg.fp8_fp4_sparse_mqa_logits(**sparse_kwargs)
    assert sparse.shape == (num_q, num_max * sparse_block_kv) and sparse.dtype == torch.bfloat16
    full = dg.fp8_fp4_mqa_logits((qq, qsf), (kq, ksf), w, ks, ke, clean_logits=False, max_seqlen_k=num_kv,
                                 logits_dtype=torch.bfloat16)
    tokens, valid = token_map(sparse_indices, counts, starts, ends, sparse_block_kv)
    full_cols = (tokens - ks.long()[:, None]).clamp(0, full.size(1) - 1)
    assert torch.equal(sparse[valid].view(torch.int16), full.gather(1, full_cols)[valid].view(torch.int16))
    for _ in range(3):
        assert torch.equal(dg.fp8_fp4_sparse_mqa_logits(**sparse_kwargs).view(torch.int16), sparse.view(torch.int16))
    check_against_torch(sparse, valid, tokens, q_f, q_deq, kv_f, kv_deq, w)


def kv_cache_cast_to_mx(x, page_kv, fmt):
    """[pages, page_kv, 1, D] -> DeepGEMM's fused MXFP4 / MXFP8 cache, pages padded to 512 bytes."""
    pages, _, _, d = x.shape
    q, sf, deq = cast_mx(x.view(-1, d), fmt)
    db = d // 2 if fmt == 'mxfp4' else d
    page_bytes = page_kv * (db + 4)
    stride = ceil_div(page_bytes, 512) * 512
    storage = torch.zeros(pages, stride, dtype=torch.uint8)
    storage[:, :page_kv * db] = q.view(torch.uint8).view(pages, -1)
    storage[:, page_kv * db:page_bytes] = sf.view(torch.uint8).view(pages, -1)
    cache = storage.as_strided((pages, page_kv, 1, db + 4), (stride, db + 4, db + 4, 1))
    return cache, deq.view(pages, page_kv, d)


@pytest.mark.parametrize('fmt', ['mxfp4', 'mxfp8'])
@pytest.mark.parametrize('sparse_block_kv', [8, 16])
def test_paged_sparse_mqa_logits(sparse_block_kv, fmt):
    rng = random.Random(7 + sparse_block_kv)
    page_kv, num_q, avg_kv, num_max = 64, 10, 256, 16
    sizes, left = [], num_q
    while left:
        sizes.append(min(rng.randint(2, 6), left))
        left -= sizes[-1]
    req_ids = [r for r, n in enumerate(sizes) for _ in range(n)]
    req_ctx = [rng.randint(int(0.7 * avg_kv) // sparse_block_kv, int(1.3 * avg_kv) // sparse_block_kv) * sparse_block_kv
               for _ in sizes]
    ctx = [c + t for c, n in zip(req_ctx, sizes) for t in range(n)]
    pages_per_req = [ceil_div(c + n - 1, page_kv) for c, n in zip(req_ctx, sizes)]
    num_pages = sum(pages_per_req)
    cache, cache_deq = kv_cache_cast_to_mx(torch.randn(num_pages, page_kv, 1, HEAD_DIM), page_kv, fmt)
    pool = torch.randperm(num_pages, dtype=torch.int32)
    req_table = torch.zeros(len(sizes), max(pages_per_req), dtype=torch.int32)
    begin = 0
    for r, n in enumerate(pages_per_req):
        req_table[r, :n] = pool[begin:begin + n]
        begin += n
    indices = torch.tensor(req_ids, dtype=torch.int32)
    block_table = req_table[indices.long()].contiguous()
    ctx_t = torch.tensor(ctx, dtype=torch.int32)
    q_f = torch.randn(num_q, 1, NUM_HEADS, HEAD_DIM)
    qq, qsf, q_deq = cast_mx(q_f, fmt)
    w = torch.randn(num_q, NUM_HEADS).to(torch.bfloat16)
    sparse_indices, counts = make_block_indices([0] * num_q, ctx, req_ids, sparse_block_kv, num_max, rng)
    metadata = dg.get_paged_sparse_mqa_logits_metadata(ctx_t, block_table, indices, page_kv, sparse_indices,
                                                       qq.dtype, sparse_block_kv)
    sparse_kwargs = dict(q=(qq, qsf), kv_cache=cache, weights=w, metadata=metadata,
                         num_max_sparse_blocks=num_max, sparse_block_kv=sparse_block_kv)
    sparse = dg.fp8_fp4_paged_sparse_mqa_logits(**sparse_kwargs)
    assert sparse.shape == (num_q, num_max * sparse_block_kv) and sparse.dtype == torch.bfloat16
    ctx_2d = ctx_t.view(-1, 1)
    full = dg.fp8_fp4_paged_mqa_logits(
        (qq, qsf), cache, w, ctx_2d, block_table,
        dg.get_paged_mqa_logits_metadata(ctx_2d, page_kv, dg.get_num_sms(), indices),
        max_context_len=max(ctx), clean_logits=False, logits_dtype=torch.bfloat16, indices=indices)
    tokens, valid = token_map(sparse_indices, counts, [0] * num_q, ctx, sparse_block_kv)
    cols = tokens.clamp(0, full.size(1) - 1)
    assert torch.equal(sparse[valid].view(torch.int16), full.gather(1, cols)[valid].view(torch.int16))
    for _ in range(3):
        assert torch.equal(dg.fp8_fp4_paged_sparse_mqa_logits(**sparse_kwargs).view(torch.int16),
                           sparse.view(torch.int16))
    # torch math per row through its block table (the unquantized reference is the dequantized cache here)
    flat = cache_deq.reshape(-1, HEAD_DIM)
    pos = tokens.clamp(0, block_table.size(1) * page_kv - 1)
    phys = block_table.long().gather(1, pos // page_kv) * page_kv + pos % page_kv
    sim = torch_logits(q_deq.view(num_q, NUM_HEADS, HEAD_DIM), flat[phys], w)
    got = sparse.float()
    assert (got[~valid] == float('-inf')).all()
    assert calc_diff(got[valid], sim[valid]) < 3e-5
    ref = torch_logits(q_f.view(num_q, NUM_HEADS, HEAD_DIM), flat[phys], w)
    assert calc_diff(got[valid], ref[valid]) < 0.02


@pytest.mark.parametrize('fp4', [False, True])
@pytest.mark.parametrize('compressed', [False, True])
def test_scheduled_mqa_logits(fp4, compressed):
    s, sk, h, d = 12, 700, 16, 64
    q = torch.randn(s, h, d)
    kv = torch.randn(sk, d)
    w = torch.randn(s, h)
    ks = torch.randint(0, 300, (s,), dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(0, 400, (s,), dtype=torch.int32), torch.tensor(sk, dtype=torch.int32))
    if fp4:
        qq, qsf, _ = cast_fp4(q)
        kq, ksf, _ = cast_fp4(kv)
        q_arg = (qq, qsf)
    else:
        q_arg = (q.to(torch.float8_e4m3fn), None)
        kq, ksf = per_custom_dims_cast_to_fp8(kv, (0,), False)
    kwargs = dict(q=q_arg, kv=(kq, ksf), weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke,
                  clean_logits=not compressed, max_seqlen_k=int((ke - ks).max()) if compressed else 0,
                  logits_dtype=torch.float32)
    meta = dg.get_mqa_logits_metadata(ks, ke, sk, h)
    block_q = 128 // h
    assert meta.dtype == torch.int32 and meta.shape == ((3 * dg.get_num_sms() + 1) // 2 * 2 + 2 * ceil_div(s, block_q),)
    plain = dg.fp8_fp4_mqa_logits(**kwargs)
    scheduled = dg.fp8_fp4_mqa_logits(**kwargs, schedule_meta=meta)
    if compressed:
        mask = torch.arange(plain.size(1))[None, :] < (ke - ks)[:, None]
        plain, scheduled = plain.masked_fill(~mask, 0), scheduled.masked_fill(~mask, 0)
    assert torch.equal(plain.view(torch.int32), scheduled.view(torch.int32))
    other = dg.get_mqa_logits_metadata(ks, torch.clamp(ke + 1, max=sk), sk, h)
    assert not torch.equal(other, meta)  # a schedule for other ranges ...
    with pytest.raises(ValueError, match='schedule_meta'):  # ... is refused as stale
        dg.fp8_fp4_mqa_logits(**kwargs, schedule_meta=other)


def test_sparse_errors():
    q_f = torch.randn(4, NUM_HEADS, HEAD_DIM)
    qq, qsf, _ = cast_fp4(q_f)
    kq, ksf, _ = cast_fp4(torch.randn(128, HEAD_DIM))
    w = torch.randn(4, NUM_HEADS).to(torch.bfloat16)
    ks = torch.tensor([0, 16, 32, 48], dtype=torch.int32)
    ke = ks + 40
    idx = torch.zeros(4, 8, dtype=torch.int32)
    meta = dg.get_sparse_mqa_logits_metadata(ks, ke, 128, idx, qq.dtype, 16)
    with pytest.raises(ValueError, match='sparse_block_kv'):
        dg.get_sparse_mqa_logits_metadata(ks, ke, 128, idx, qq.dtype, 12)
    with pytest.raises(TypeError, match='qk_dtype'):
        dg.get_sparse_mqa_logits_metadata(ks, ke, 128, idx, torch.bfloat16, 16)
    with pytest.raises(ValueError, match='use_unaligned_ks'):
        dg.get_sparse_mqa_logits_metadata(ks + 1, ke, 128, idx, qq.dtype, 16)
    with pytest.raises(ValueError, match='metadata'):
        dg.fp8_fp4_sparse_mqa_logits((qq, qsf), (kq, ksf), w, meta, 8, 16, use_unaligned_ks=True)
    with pytest.raises(ValueError, match='num_max_sparse_blocks'):
        dg.fp8_fp4_sparse_mqa_logits((qq, qsf), (kq, ksf), w, meta, 6, 16)
    with pytest.raises(TypeError, match="'kv'"):  # MXFP8 q with FP4 kv
        dg.fp8_fp4_sparse_mqa_logits((q_f.to(torch.float8_e4m3fn), qsf), (kq, ksf), w, meta, 8, 16)
    out = dg.fp8_fp4_sparse_mqa_logits((qq, qsf), (kq, ksf), w, meta, 8, 16)
    # every entry is block 0 (duplicates allowed): row 0 scores it in each of its 3 blocks, the
    # other rows' ranges do not contain it, and the padding past 3 blocks is never scored
    assert (out[0, :48] != float('-inf')).all() and (out[0, 48:] == float('-inf')).all()
    assert (out[1:, :] == float('-inf')).all()
    assert torch.equal(out[0, :16], out[0, 16:32])

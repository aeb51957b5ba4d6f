"""deep_gemm_cpu.utils against DeepGEMM's torch formulas (restated in conftest), bit for bit."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu import utils
from conftest import (ref_per_token_cast_to_fp8, ref_per_block_cast_to_fp8, ref_per_channel_cast_to_fp8,
                      ref_per_custom_dims_cast_to_fp8, ref_per_token_cast_to_fp4, ref_ceil_to_ue8m0,
                      ref_pack_ue8m0_to_int, ref_unpack_ue8m0_from_int, fp4_dequant, calc_diff)


def same_bits(x, y):
    assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
    assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def sample(m, k, dtype):
    x = torch.randn(m, k) * torch.exp2(torch.randint(-6, 6, (m, 1)).float())
    x[0, :3] = 0  # zero groups and tails are interesting
    return x.to(dtype)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('use_ue8m0', [False, True])
@pytest.mark.parametrize('m,k,gran_k', [(1, 128, 128), (5, 200, 128), (7, 96, 32), (16, 512, 128)])
def test_per_token_cast_to_fp8(dtype, use_ue8m0, m, k, gran_k):
    x = sample(m, k, dtype)
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0, gran_k=gran_k)
    rq, rsf = ref_per_token_cast_to_fp8(x, use_ue8m0, gran_k)
    same_bits(q, rq)
    same_bits(sf, rsf)
    if use_ue8m0:  # packed: a partial last word is padded with 1.0
        q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
        same_bits(sf, ref_per_token_cast_to_fp8(x, True, gran_k, True)[1])


@pytest.mark.parametrize('use_ue8m0', [False, True])
@pytest.mark.parametrize('m,k', [(1, 1), (130, 200), (256, 128)])
def test_per_block_cast_to_fp8(use_ue8m0, m, k):
    x = sample(m, k, torch.bfloat16)
    q, sf = utils.per_block_cast_to_fp8(x, use_ue8m0)
    rq, rsf = ref_per_block_cast_to_fp8(x, use_ue8m0)
    same_bits(q, rq)
    same_bits(sf, rsf)


@pytest.mark.parametrize('use_ue8m0', [False, True])
def test_per_channel_cast_to_fp8(use_ue8m0):
    x = sample(256, 40, torch.float32)
    q, sf = utils.per_channel_cast_to_fp8(x, use_ue8m0)
    rq, rsf = ref_per_channel_cast_to_fp8(x, use_ue8m0)
    same_bits(q, rq)
    same_bits(sf, rsf)


@pytest.mark.parametrize('dims', [(0,), (1,), (0, 2), (2,)])
def test_per_custom_dims_cast_to_fp8(dims):
    x = torch.randn(3, 4, 5)
    q, sf = utils.per_custom_dims_cast_to_fp8(x, dims, False)
    rq, rsf = ref_per_custom_dims_cast_to_fp8(x, dims, False)
    same_bits(q, rq)
    same_bits(sf, rsf)


@pytest.mark.parametrize('use_ue8m0,packed', [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize('m,k,gran_k', [(3, 64, 32), (4, 256, 128), (2, 160, 32)])
def test_per_token_cast_to_fp4_and_back(use_ue8m0, packed, m, k, gran_k):
    x = sample(m, k, torch.float32)
    q, sf = utils.per_token_cast_to_fp4(x, use_ue8m0, gran_k=gran_k, use_packed_ue8m0=packed)
    rq, rsf = ref_per_token_cast_to_fp4(x, use_ue8m0, gran_k, packed)
    assert q.dtype == torch.int8
    same_bits(q, rq)
    same_bits(sf, rsf)
    back = utils.cast_back_from_fp4(q, sf, gran_k=gran_k, use_packed_ue8m0=packed)
    same_bits(back, fp4_dequant(q, sf, gran_k, packed))
    assert calc_diff(back, x) < 0.02


def test_transpose_packed_fp4():
    q, _ = utils.per_token_cast_to_fp4(torch.randn(6, 10), False, gran_k=32)
    t = utils.transpose_packed_fp4(q)
    codes = torch.empty(6, 10, dtype=torch.int8)
    codes[:, 0::2], codes[:, 1::2] = q & 0x0F, (q >> 4) & 0x0F
    ct = codes.t().contiguous().view(10, 3, 2)
    same_bits(t, (ct[:, :, 0] & 0x0F) | ((ct[:, :, 1] & 0x0F) << 4))


def test_ue8m0_helpers():
    x = torch.cat([torch.randn(64).abs() * 1e3, torch.tensor([0.0, 1.0, 2.0 ** -130, 3e38])]).view(4, 17)
    same_bits(utils.ceil_to_ue8m0(x), ref_ceil_to_ue8m0(x))
    same_bits(utils.ceil_to_ue8m0(x.bfloat16()), ref_ceil_to_ue8m0(x.bfloat16()))
    p2 = ref_ceil_to_ue8m0(torch.randn(3, 8))
    packed = utils.pack_ue8m0_to_int(p2)
    same_bits(packed, ref_pack_ue8m0_to_int(p2))
    same_bits(utils.unpack_ue8m0_from_int(packed), ref_unpack_ue8m0_from_int(packed))


def test_int_helpers_and_calc_diff():
    assert utils.ceil_div(7, 3) == 3 and utils.align(7, 4) == 8 and dg.align(8, 4) == 8
    assert dg.get_tma_aligned_size(5, 4) == 8 and dg.get_tma_aligned_size(5, 1) == 16
    x, y = torch.randn(10, 7), torch.randn(10, 7)
    assert abs(utils.calc_diff(x, y) - calc_diff(x, y)) < 1e-12
    assert dg.testing.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert abs(dg.testing.calc_diff(x.double(), y.double()) - calc_diff(x, y)) < 1e-12
    assert dg.testing.count_bytes(x, (y.bfloat16(), None)) == 280 + 140
    assert dg.testing.bench(lambda: None, num_warmups=1, num_tests=2) >= 0
    t1, t2 = dg.testing.bench_kineto(lambda: None, ('a', 'b'), num_tests=2)
    assert t1 >= 0 and t2 >= 0

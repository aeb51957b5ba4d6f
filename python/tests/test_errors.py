"""Error cases: the right exception, the argument named in the message, nothing written."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp8, per_block_cast_to_fp8
from conftest import FakeCudaTensor


def operands(m=8, n=16, k=128):
    return (torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16),
            torch.full((m, n), 3.0, dtype=torch.bfloat16))


def test_wrong_dtype_is_type_error():
    a, b, d = operands()
    with pytest.raises(TypeError, match="'a'"):
        dg.bf16_gemm_nt(a.float(), b, d)
    with pytest.raises(TypeError, match="'a'.*float16"):
        dg.bf16_gemm_nt(a.half(), b, d)
    assert (d == 3.0).all()


def test_shape_mismatch_is_value_error():
    a, b, d = operands()
    with pytest.raises(ValueError, match="'a' and 'b'"):
        dg.bf16_gemm_nt(a, b[:, :64], d)
    with pytest.raises(ValueError, match="'d'"):
        dg.bf16_gemm_nt(a, b, d[:, :8])
    assert (d == 3.0).all()


def test_cuda_and_meta_tensors_rejected():
    a, b, d = operands()
    with pytest.raises(ValueError, match="'b' is on device 'cuda:0'"):
        dg.bf16_gemm_nt(a, FakeCudaTensor(b), d)
    with pytest.raises(ValueError, match="'d' is on device 'meta'"):
        dg.bf16_gemm_nt(a, b, torch.empty(8, 16, dtype=torch.bfloat16, device='meta'))
    assert (d == 3.0).all()


def test_non_contiguous_where_required():
    q = torch.randn(4, 8, 64).to(torch.float8_e4m3fn)
    kv, kv_sf = torch.randn(32, 64).to(torch.float8_e4m3fn), torch.ones(32)
    w = torch.randn(4, 8)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 32, dtype=torch.int32)
    qs = torch.randn(4, 64, 8).to(torch.float8_e4m3fn).transpose(1, 2)  # same shape, not contiguous
    with pytest.raises(ValueError, match="'q'.*contiguous"):
        dg.fp8_mqa_logits(qs, (kv, kv_sf), w, ks, ke)
    assert dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke).shape == (4, 32)
    d = torch.full((8, 16), 3.0, dtype=torch.bfloat16)
    dn = torch.full((16, 8), 3.0, dtype=torch.bfloat16).t()  # unit stride along M, not N
    a, b, _ = operands()
    with pytest.raises(ValueError, match="'d'"):
        dg.bf16_gemm_nt(a, b, dn)
    assert (dn == 3.0).all() and (d == 3.0).all()


def test_tuple_and_argument_errors():
    a, b, d = operands()
    qa, qb = per_token_cast_to_fp8(a, False), per_block_cast_to_fp8(b, False)
    with pytest.raises(TypeError, match="'a' must be a \\(tensor, scale factors\\) tuple"):
        dg.fp8_gemm_nt(qa[0], qb, d)
    with pytest.raises(TypeError, match="'recipe'"):
        dg.fp8_gemm_nt(qa, qb, d, recipe=(1, 128))
    with pytest.raises(TypeError, match="'b\\[1\\]' is required"):
        dg.fp8_gemm_nt(qa, (qb[0], None), d)
    with pytest.raises(TypeError, match="must be a torch.Tensor or numpy.ndarray"):
        dg.bf16_gemm_nt([[1.0]], b, d)
    with pytest.raises(TypeError):
        dg.bf16_gemm_nt(a, b, d, bogus=1)
    with pytest.raises(ValueError, match="'sfb'|'b\\[1\\]'"):
        dg.fp8_gemm_nt(qa, (qb[0], qb[1][:, :0]), d)
    assert (d == 3.0).all()


def test_bad_index_contents_write_nothing():
    a = torch.randn(256, 128, dtype=torch.bfloat16)
    b = torch.randn(2, 32, 128, dtype=torch.bfloat16)
    d = torch.full((256, 32), 3.0, dtype=torch.bfloat16)
    layout = torch.zeros(256, dtype=torch.int32)
    layout[5] = 7  # out of range group
    with pytest.raises(ValueError, match='grouped_layout'):
        dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout)
    masked = torch.tensor([300, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match='masked_m'):
        dg.m_grouped_bf16_gemm_nt_masked(a.view(2, 128, 128), b, d.view(2, 128, 32), masked, 64)
    assert (d == 3.0).all()


def test_numpy_readonly_output():
    np = pytest.importorskip('numpy')
    ml = pytest.importorskip('ml_dtypes')
    a = np.ones((4, 8), dtype=ml.bfloat16)
    b = np.ones((3, 8), dtype=ml.bfloat16)
    d = np.zeros((4, 3), dtype=np.float32)
    d.flags.writeable = False
    with pytest.raises(ValueError, match="'d' is read-only"):
        dg.bf16_gemm_nt(a, b, d)
    assert (d == 0).all()

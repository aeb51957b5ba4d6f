"""NumPy inputs (ml_dtypes bfloat16 / float8_e4m3fn) without copies; outputs allocated by the
module are NumPy arrays when the inputs are."""
import pytest
import torch

np = pytest.importorskip('numpy')
ml = pytest.importorskip('ml_dtypes')

import deep_gemm_cpu as dg
from conftest import calc_diff


def test_numpy_bf16_gemm_zero_copy_and_views():
    a = np.random.default_rng(0).standard_normal((8, 64)).astype(ml.bfloat16)
    b = np.random.default_rng(1).standard_normal((64, 12)).astype(ml.bfloat16).T  # MN-major view
    d = np.zeros((8, 12), dtype=np.float32)
    dg.bf16_gemm_nt(a, b, d)
    ref = a.astype(np.float32) @ b.astype(np.float32).T
    assert calc_diff(torch.from_numpy(d), torch.from_numpy(ref)) < 1e-5
    d2 = np.zeros((12, 8), dtype=np.float32).T  # output with the wrong unit stride
    with pytest.raises(ValueError, match="'d'"):
        dg.bf16_gemm_nt(a, b, d2)


def test_numpy_quant_and_fp8_gemm():
    x = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((32, 256)).astype(np.float32)
    qx, sx = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    qw, sw = dg.per_block_cast_to_fp8(w, use_ue8m0=False)
    assert isinstance(qx, np.ndarray) and qx.dtype == np.dtype(ml.float8_e4m3fn) and sx.dtype == np.float32
    # Same bits as torch's path
    tq, ts = dg.per_token_cast_to_fp8(torch.from_numpy(x), use_ue8m0=False)
    assert np.array_equal(qx.view(np.uint8), tq.view(torch.uint8).numpy()) and np.array_equal(sx, ts.numpy())
    d = np.empty((16, 32), dtype=ml.bfloat16)
    dg.fp8_gemm_nt((qx, sx), (qw, sw), d)
    assert calc_diff(torch.from_numpy(d.astype(np.float32)), torch.from_numpy(x @ w.T)) < 1e-3


def test_numpy_layout_and_logits_allocate_numpy():
    sf = np.exp2(np.arange(12, dtype=np.float32) % 5).reshape(3, 4)
    out = dg.get_mn_major_tma_aligned_tensor(sf)
    assert isinstance(out, np.ndarray) and np.array_equal(out, sf) and out.strides == (4, 16)
    q = np.random.default_rng(4).standard_normal((2, 4, 32)).astype(ml.float8_e4m3fn)
    kv = np.random.default_rng(5).standard_normal((10, 32)).astype(ml.float8_e4m3fn)
    logits = dg.fp8_mqa_logits(q, (kv, np.ones(10, np.float32)), np.ones((2, 4), np.float32),
                               np.zeros(2, np.int32), np.full(2, 10, np.int32))
    assert isinstance(logits, np.ndarray) and logits.shape == (2, 10)
    ref = np.maximum(np.einsum('shd,td->sht', q.astype(np.float32), kv.astype(np.float32)), 0).sum(1)
    assert calc_diff(torch.from_numpy(np.ascontiguousarray(logits)), torch.from_numpy(ref)) < 1e-6


def test_zero_copy_torch_strided_output():
    """A padded output view: the kernel writes through the caller's strides, padding untouched."""
    a, b = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(16, 64, dtype=torch.bfloat16)
    big = torch.full((8, 40), 9.0)
    d = big[:, 4:20]
    dg.bf16_gemm_nt(a, b, d)
    assert calc_diff(big[:, 4:20], a.float() @ b.float().t()) < 1e-5
    assert (big[:, :4] == 9.0).all() and (big[:, 20:] == 9.0).all()

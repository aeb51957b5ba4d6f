"""Error cases: the right exception, the argument named in the message, nothing written."""
import re

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


def _parse_unknown_keyword(fn):
    """Calls fn with enough positional placeholders to pass its required arguments plus an unknown
    keyword, and returns the exception. Placeholders are 0, or 'x' where a str is required."""
    args = []
    for _ in range(40):
        try:
            fn(*args, no_such_keyword_arg=1)
        except TypeError as e:
            msg = str(e)
            if 'missing required' in msg or 'required argument' in msg:
                args.append(0)
                continue
            m = re.search(r'argument (\d+) must be str', msg)
            if m:
                args[int(m.group(1)) - 1] = 'x'
                continue
            return e
        except Exception as e:  # noqa: BLE001 - the point is which exception
            return e
        return None
    return None


def test_every_binding_parses_its_keywords():
    """Each binding's keyword list matches its format (issue 17: a mismatch raised SystemError
    for every keyword past the format, and for any unknown keyword)."""
    names = [n for n in dir(dg._C) if not n.startswith('_') and callable(getattr(dg._C, n))]
    assert 'fp8_mqa_logits' in names
    for name in names:
        err = _parse_unknown_keyword(getattr(dg._C, name))
        if err is None or isinstance(err, NotImplementedError):
            continue
        assert isinstance(err, TypeError), f'{name}: {type(err).__name__}: {err}'
        # 'takes at most': only required arguments, so the extra keyword is one too many
        assert 'no_such_keyword_arg' in str(err) or 'keyword' in str(err) or 'at most' in str(err), \
            f'{name}: {err}'


def test_grouped_messages_name_the_argument():
    """Issue 17: every message names the function and the argument ("groups, max_m, N and K must
    be positive" named neither)."""
    a = torch.randn(2, 8, 128, dtype=torch.bfloat16)
    b = torch.randn(2, 16, 128, dtype=torch.bfloat16)
    d = torch.full((2, 8, 16), 3.0, dtype=torch.bfloat16)
    mm = torch.tensor([8, 3], dtype=torch.int32)
    fn = 'm_grouped_bf16_gemm_nt_masked'
    cases = [
        ((a[:, :0], b, d[:, :0], mm, 4), "argument 'a'"),
        ((a, b[:, :0], d[:, :, :0], mm, 4), "argument 'b'"),
        ((a, b, d, mm, 0), "argument 'expected_m'"),
        ((a, b, d, torch.tensor([8, 9], dtype=torch.int32), 4), "argument 'masked_m': entry 1"),
    ]
    for args, needle in cases:
        with pytest.raises(ValueError, match=f'{fn}: .*{re.escape(needle)}'):
            dg.m_grouped_bf16_gemm_nt_masked(*args)
    assert (d == 3.0).all()
    ac = torch.randn(16, 128, dtype=torch.bfloat16)
    dc = torch.full((16, 16), 3.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'grouped_layout': entry 3"):
        dg.m_grouped_bf16_gemm_nt_contiguous(ac, b, dc, torch.tensor([0] * 3 + [5] + [1] * 12, dtype=torch.int32))
    with pytest.raises(ValueError, match="argument 'expected_m_for_psum_layout'"):
        dg.m_grouped_bf16_gemm_nt_contiguous(ac, b, dc, torch.zeros(16, dtype=torch.int32),
                                             expected_m_for_psum_layout=8)
    assert (dc == 3.0).all()
    ak, bk = torch.randn(256, 8, dtype=torch.bfloat16), torch.randn(256, 16, dtype=torch.bfloat16)
    dk = torch.zeros(2, 8, 16)
    with pytest.raises(ValueError, match="argument 'ks': entry 1"):
        dg.k_grouped_bf16_gemm_tn_contiguous(ak, bk, dk, [128, 100], torch.tensor([128, 100], dtype=torch.int32))


def test_settings_messages_name_the_argument():
    with pytest.raises(ValueError, match="set_num_sms: argument 'num_sms'"):
        dg.set_num_sms(0)
    with pytest.raises(ValueError, match="set_tc_util: argument 'tc_util'"):
        dg.set_tc_util(101)
    with pytest.raises(ValueError, match="argument 'alignment'"):
        dg.set_mk_alignment_for_contiguous_layout(0)


def test_impossible_size_rejected_at_once():
    """Issue 17: a broadcast view whose packed layout no process could hold is refused from its
    shape and strides, without checking its 6.6e17 logical elements first."""
    import time
    sf = torch.zeros(1, 1).expand(128, 5146971002709138)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="argument 'sf'"):
        dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert time.perf_counter() - t0 < 0.5  # 10 ms in C; generous for the interpreter

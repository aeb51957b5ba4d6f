"""Property-based tests (hypothesis) over deep_gemm_cpu (issue 17's hardening).

Valid calls: random shapes that DeepGEMM's API allows (M = 1, every dimension with tails past
the kernels' and the scales' block sizes, K = 0, empty M / N, empty groups, masked and padding
rows), checked against float64 torch math or the conftest restatements of DeepGEMM's torch
formulas, with DeepGEMM's calc_diff thresholds. The FP8 GEMMs are compared with the float64
product of their *dequantized* operands: the library multiplies exactly those values, so the
quantization error is not in play and the BF16 threshold (1e-5, tighter than FP8's 1e-3)
applies; a wrong scale in one tail block shows. Outputs live in buffers filled with a NaN
sentinel, so any element the call must leave alone (row padding, masked rows, -1 rows,
mid-head columns) is checked bit for bit, and an element it must write cannot stay NaN.
Inputs are checked to be unchanged by every call.

Invalid calls: a valid call with one argument spoiled (dtype, ndim, shape, strides, aliasing,
device, Python type, out-of-range contents, negative / absurd sizes, bad recipe tuples). Each
must raise TypeError / ValueError (as the README says: dtype -> TypeError, shape, layout, value,
device -> ValueError) with a message naming the function and the argument, and leave every
tensor, the sentinel-filled outputs included, bitwise as it was.

Integer arguments (huge, negative, not ints) and logits_dtype have plain tests at the end as
well, from the bugs these properties found (issue 17, fixed in the bindings).

Profiles: 'dg-ci' (default; derandomized, small: the file runs in seconds, also under ASan) and
'dg-dev' (random, many more examples): DG_HYPOTHESIS_PROFILE=dg-dev pytest test_properties.py.
"""
import os
import tempfile

import pytest

hypothesis = pytest.importorskip('hypothesis')  # CI installs it (.ci/run); skip only as a fallback
from hypothesis import HealthCheck, Phase, given, note, settings, strategies as st  # noqa: E402

import torch  # noqa: E402

if not os.environ.get('HYPOTHESIS_STORAGE_DIRECTORY'):  # not .hypothesis/ in the working directory
    hypothesis.configuration.set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), 'deep_gemm_cpu-hypothesis'))

import deep_gemm_cpu as dg  # noqa: E402
from deep_gemm_cpu import utils  # noqa: E402
from conftest import (align, calc_diff, ceil_div, fp4_dequant, fp8_dequant_blocks,  # noqa: E402
                      fp8_dequant_rows, ref_ceil_to_ue8m0, ref_pack_ue8m0_to_int, ref_per_block_cast_to_fp8,
                      ref_per_channel_cast_to_fp8, ref_per_custom_dims_cast_to_fp8, ref_per_token_cast_to_fp4,
                      ref_per_token_cast_to_fp8, ref_unpack_ue8m0_from_int)

# No example database and no explain phase: nothing is written into the source tree (the explain
# phase writes .hypothesis/patches); a failure still prints its shrunk example.
_COMMON = dict(deadline=None, database=None, print_blob=False,
               phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
settings.register_profile('dg-ci', derandomize=True, max_examples=20, **_COMMON)
settings.register_profile('dg-dev', derandomize=False, max_examples=400, **_COMMON)
settings.load_profile(os.environ.get('DG_HYPOTHESIS_PROFILE', 'dg-ci'))


def examples(n):
    """n examples in the CI profile, scaled up with the profile's max_examples (dg-dev)."""
    return settings(max_examples=max(1, n * settings.default.max_examples // 20))


BF16_TOL = 1e-5   # DeepGEMM's BF16 threshold (also used for FP8 against dequantized operands)
FP8_TOL = 1e-3    # DeepGEMM's FP8 threshold (MQA logits, against dequantized q and kv, as test_attention)
HC_TOL = 1e-8     # deepgemm.h: float32 HC prenorm against float64 is far below DeepGEMM's 1e-8
LAYOUTS = ['nt', 'nn', 'tn', 'tt']
BF, F32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn

# ---- tensors, sentinels, snapshots -------------------------------------------------------------

seeds = st.integers(0, 2 ** 31 - 1)


def dims(lo, hi, interesting=(1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)):
    """Sizes in [lo, hi], biased to the block boundaries of the kernels and of the scales."""
    picks = sorted({v for v in (lo, hi) + tuple(interesting) if lo <= v <= hi})
    return st.one_of(st.sampled_from(picks), st.integers(lo, hi))


def randn(g, *shape, dtype=F32):
    return torch.randn(shape, generator=g).to(dtype)


_SENTINEL = {BF: (torch.int16, 0x7FA5), F32: (torch.int32, 0x7FC0DEAD), torch.float16: (torch.int16, 0x7E5A),
             torch.int32: (torch.int32, 0x5A5A5A5A), torch.float64: (torch.int64, 0x7FF8DEADBEEF0001)}


def sentinel(*shape, dtype=BF, pad=0):
    """A NaN-payload-filled output [..., last + pad] and its [..., last] view (row padding)."""
    idt, val = _SENTINEL[dtype]
    base = torch.empty(*shape[:-1], shape[-1] + pad, dtype=dtype)
    base.view(idt).fill_(val)
    return base, base[..., :shape[-1]]


def is_sentinel(t):
    idt, val = _SENTINEL[t.dtype]
    return bool((t.contiguous().view(idt) == val).all())


def _tensors(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _storage_bytes(t):
    """All bytes of the storage behind t (padding and other views included), as uint8."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


class Snapshot:
    """Bytes of the storage behind every tensor in the arguments (outputs included)."""

    def __init__(self, *objs):
        self.items = []
        seen = set()
        for t in _tensors(objs, []):
            if t.device.type != 'cpu' or t.untyped_storage().data_ptr() in seen:
                continue
            seen.add(t.untyped_storage().data_ptr())
            view = _storage_bytes(t)
            self.items.append((view, view.clone()))

    def assert_unchanged(self, what='a tensor'):
        for now, before in self.items:
            assert torch.equal(now, before), f'{what} was modified'


class backend:
    """with backend('reference'): the scalar reference kernels (the executable contract)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.old = dg.get_backend()
        dg.set_backend(self.name)

    def __exit__(self, *exc):
        dg.set_backend(self.old)


class threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = dg.get_num_sms()
        dg.set_num_sms(self.n)

    def __exit__(self, *exc):
        dg.set_num_sms(self.old)


BACKENDS = st.sampled_from(['auto', 'auto', 'reference'])


def k_major_or_mn_major(t, mn_major):
    """The same values as t [R, C], as an MN-major view (unit stride along R) when asked."""
    return t.t().contiguous().t() if mn_major else t


def gemm_operands(layout, a, b):
    """a [M, K], b [N, K] -> the `layout` variant's operands (as test_gemm.make_ab_for)."""
    return (a if layout[0] == 'n' else a.t().contiguous()), (b if layout[1] == 't' else b.t().contiguous())


def quant_pair(qa, sfa, transpose):
    return (qa.t().contiguous(), sfa.t().contiguous()) if transpose else (qa, sfa)


def check_close(d, ref, tol, what):
    diff = calc_diff(d.double(), ref.double())
    note(f'{what}: calc_diff {diff:.3g}')
    assert diff < tol, f'{what}: calc_diff {diff} >= {tol}'


# ---- dense GEMMs ---------------------------------------------------------------------------------

@examples(40)
@given(layout=st.sampled_from(LAYOUTS), m=dims(0, 72), n=dims(0, 72), k=dims(0, 300),
       out_dtype=st.sampled_from([BF, F32]), acc=st.sampled_from(['none', 'separate', 'in_place']),
       mn_major=st.tuples(st.booleans(), st.booleans()), pad=st.integers(0, 3), impl=BACKENDS, seed=seeds)
def test_bf16_gemm(layout, m, n, k, out_dtype, acc, mn_major, pad, impl, seed):
    """d = c + a @ b.T in every layout; any strides for `_nt` operands; padded rows of d untouched."""
    g = torch.Generator().manual_seed(seed)
    a, b = randn(g, m, k, dtype=BF), randn(g, n, k, dtype=BF)
    ref = a.double() @ b.double().t()
    ta, tb = gemm_operands(layout, a, b)
    if layout == 'nt':
        ta, tb = k_major_or_mn_major(ta, mn_major[0]), k_major_or_mn_major(tb, mn_major[1])
    base, d = sentinel(m, n, dtype=out_dtype, pad=pad)
    kw = {}
    if acc != 'none':
        c = (randn(g, m, n) * 4).to(out_dtype)
        ref = ref + c.double()
        if acc == 'in_place':
            d.copy_(c)
            kw['c'] = d
        else:
            kw['c'] = c
    inputs = Snapshot(ta, tb, kw.get('c') if acc == 'separate' else None)
    with backend(impl):
        getattr(dg, f'bf16_gemm_{layout}')(ta, tb, d, **kw)
    inputs.assert_unchanged('an input')
    check_close(d, ref, BF16_TOL, f'bf16_gemm_{layout}')
    assert is_sentinel(base[:, n:]), 'row padding of d written'


def fp8_operands(g, m, n, k, ue8m0):
    """DeepGEMM's 1D2D recipe: per-token A (1 x 128), per-block B (128 x 128), float32 scales
    (powers of two with ue8m0). Returns the quantized pairs and their dequantized values."""
    a, b = randn(g, m, k, dtype=BF), randn(g, n, k, dtype=BF)
    qa, sfa = utils.per_token_cast_to_fp8(a, use_ue8m0=ue8m0)
    qb, sfb = utils.per_block_cast_to_fp8(b, use_ue8m0=ue8m0)
    return (qa, sfa), (qb, sfb), fp8_dequant_rows(qa, sfa, 128), fp8_dequant_blocks(qb, sfb)


@examples(40)
@given(layout=st.sampled_from(LAYOUTS), m=dims(1, 64), n=dims(1, 260), k=dims(1, 400),
       ue8m0=st.booleans(), explicit_recipe=st.booleans(), out_dtype=st.sampled_from([BF, F32]),
       acc=st.sampled_from(['none', 'separate', 'in_place']), pad=st.integers(0, 2),
       mn_major=st.lists(st.booleans(), min_size=4, max_size=4), impl=BACKENDS, seed=seeds)
def test_fp8_gemm_1d2d(layout, m, n, k, ue8m0, explicit_recipe, out_dtype, acc, pad, mn_major, impl, seed):
    """Per-token A, per-block B (float32 scales, UE8M0 or not), every layout; `_nt` takes data
    and scales of any strides (MN-major views here)."""
    g = torch.Generator().manual_seed(seed)
    (qa, sfa), (qb, sfb), da, db = fp8_operands(g, m, n, k, ue8m0)
    ref = da.double() @ db.double().t()
    a_arg = quant_pair(qa, sfa, layout[0] == 't')
    b_arg = quant_pair(qb, sfb, layout[1] == 'n')
    if layout == 'nt':
        a_arg = tuple(k_major_or_mn_major(t, f) for t, f in zip(a_arg, mn_major[:2]))
        b_arg = tuple(k_major_or_mn_major(t, f) for t, f in zip(b_arg, mn_major[2:]))
    base, d = sentinel(m, n, dtype=out_dtype, pad=pad)
    kw = {'recipe': (1, 128, 128)} if explicit_recipe else {}
    if acc != 'none':
        c = (randn(g, m, n) * 4).to(out_dtype)
        ref = ref + c.double()
        if acc == 'in_place':
            d.copy_(c)
            kw['c'] = d
        else:
            kw['c'] = c
    inputs = Snapshot(a_arg, b_arg, kw.get('c') if acc == 'separate' else None)
    with backend(impl):
        getattr(dg, f'fp8_gemm_{layout}')(a_arg, b_arg, d, **kw)
    inputs.assert_unchanged('an input')
    check_close(d, ref, BF16_TOL, f'fp8_gemm_{layout}')
    assert is_sentinel(base[:, n:]), 'row padding of d written'


def quant_per_token(x, fp4, gran_k):
    """(data, scales) with UE8M0 scales per 1 x gran_k: packed FP4 with packed int32 scales, or
    FP8 with float32 ones; and the dequantized values."""
    if fp4:
        q, sf = utils.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
        return (q, sf), fp4_dequant(q, sf, gran_k, packed_sf=True)
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)
    return (q, sf), fp8_dequant_rows(q, sf, gran_k)


@examples(20)
@given(fp4=st.tuples(st.booleans(), st.booleans()), gran_k=st.sampled_from([32, 128]), m=dims(1, 40),
       n=dims(1, 140), k2=dims(1, 260), out_dtype=st.sampled_from([BF, F32]), seed=seeds)
def test_fp8_fp4_gemm_nt_per_token_recipes(fp4, gran_k, m, n, k2, out_dtype, seed):
    """fp8_fp4_gemm_nt with recipe_a = recipe_b = (1, gran_k): FP8 x FP8, FP8 x FP4, FP4 x FP8 and
    FP4 x FP4 (the integer path), K tails of the scale blocks."""
    g = torch.Generator().manual_seed(seed)
    k = 2 * k2
    a_arg, da = quant_per_token(randn(g, m, k, dtype=BF), fp4[0], gran_k)
    b_arg, db = quant_per_token(randn(g, n, k, dtype=BF), fp4[1], gran_k)
    base, d = sentinel(m, n, dtype=out_dtype, pad=1)
    inputs = Snapshot(a_arg, b_arg)
    dg.fp8_fp4_gemm_nt(a_arg, b_arg, d, recipe_a=(1, gran_k), recipe_b=(1, gran_k))
    inputs.assert_unchanged('an input')
    check_close(d, da.double() @ db.double().t(), BF16_TOL, 'fp8_fp4_gemm_nt')
    assert is_sentinel(base[:, n:]), 'row padding of d written'


@examples(15)
@given(heads=dims(1, 3), left=dims(1, 40), mid=dims(0, 20), right=dims(1, 40), m=dims(1, 20),
       k=st.sampled_from([128, 256, 384]), seed=seeds)
def test_fp8_gemm_nt_skip_head_mid(heads, left, mid, right, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    (qa, sfa), (qb, sfb), da, db = fp8_operands(g, m, heads * (left + right), k, False)
    base, d = sentinel(m, heads * (left + mid + right))
    dg.fp8_gemm_nt_skip_head_mid((qa, sfa), (qb, sfb), d, (left, mid, right))
    full = (da.double() @ db.double().t()).view(m, heads, left + right)
    dv = d.view(m, heads, left + mid + right)
    check_close(dv[:, :, :left], full[:, :, :left], BF16_TOL, 'left')
    check_close(dv[:, :, left + mid:], full[:, :, left:], BF16_TOL, 'right')
    assert is_sentinel(dv[:, :, left:left + mid].contiguous()), 'mid columns written'


# ---- m-grouped GEMMs -------------------------------------------------------------------------------

@st.composite
def grouped_contiguous(draw, max_groups=3, max_rows=140):
    num_groups = draw(st.integers(1, max_groups))
    ms = draw(st.lists(st.one_of(st.just(0), dims(1, max_rows)), min_size=num_groups, max_size=num_groups))
    return ms


def contiguous_layout(ms, al, psum, trim_last):
    """DeepGEMM's generate_m_grouped_contiguous: group g's rows at an aligned start. Index form:
    [M] group per row, -1 for padding; psum form: [G] end rows (the last group's padding may be
    cut off: M = its end). Returns M, the layout, each group's (start, end) rows and, per row,
    what D must hold there: a group index, -1 (untouched) or -2 (zero: psum padding)."""
    starts, start = [], 0
    for x in ms:
        starts.append(start)
        start += align(x, al)
    m = start
    if psum and trim_last:
        m = starts[-1] + ms[-1]
    row_kind = torch.full((m,), -1, dtype=torch.int64)
    for gi, (s, x) in enumerate(zip(starts, ms)):
        row_kind[s:s + x] = gi
        if psum:
            row_kind[s + x:min(s + align(x, al), m)] = -2
    if psum:
        layout = torch.tensor([s + x for s, x in zip(starts, ms)], dtype=torch.int32)
    else:
        layout = row_kind.clamp(min=-1).to(torch.int32)
    return m, layout, [(s, s + x) for s, x in zip(starts, ms)], row_kind


@examples(30)
@given(ms=grouped_contiguous(), n=dims(1, 48), k=dims(1, 200), fp8=st.booleans(), nn=st.booleans(),
       psum=st.booleans(), trim_last=st.booleans(), ensure_zero=st.booleans(), scatter=st.booleans(),
       al=st.sampled_from([32, 128]), out_dtype=st.sampled_from([BF, F32]), seed=seeds)
def test_m_grouped_contiguous(ms, n, k, fp8, nn, psum, trim_last, ensure_zero, scatter, al, out_dtype, seed):
    """bf16 / fp8 (1D2D) m-grouped contiguous GEMMs, `_nt` and `_nn`, index and psum layouts,
    empty groups. Index form: -1 rows of A hold NaN (never read) and their D rows stay as they
    were; the index form also takes rows in any order (`scatter`: DeepGEMM's layout with its rows
    shuffled); psum form: padding rows are zeroed only with ensure_zero_padding."""
    g = torch.Generator().manual_seed(seed)
    old_al = dg.get_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(al)
    try:
        m, layout, _, row_kind = contiguous_layout(ms, al, psum, trim_last)
        if scatter and not psum:
            perm = torch.randperm(m, generator=g)
            layout, row_kind = layout[perm].contiguous(), row_kind[perm]
        num_groups = len(ms)
        a = randn(g, m, k, dtype=BF)
        b = randn(g, num_groups, n, k, dtype=BF)
        if fp8:
            qa, sfa = utils.per_token_cast_to_fp8(a, use_ue8m0=False)
            qbs = [utils.per_block_cast_to_fp8(b[i], use_ue8m0=False) for i in range(num_groups)]
            qb, sfb = torch.stack([q for q, _ in qbs]), torch.stack([s for _, s in qbs])
            da, db = fp8_dequant_rows(qa, sfa, 128), torch.stack([fp8_dequant_blocks(q, s) for q, s in qbs])
            if not psum:  # padding rows are not read: poison them
                qa.view(torch.uint8)[row_kind == -1] = 0x7F  # E4M3 NaN
                sfa[row_kind == -1] = float('nan')
            a_arg = (qa, sfa)
            b_arg = (qb.mT.contiguous(), sfb.mT.contiguous()) if nn else (qb, sfb)
            name = 'm_grouped_fp8_gemm_nn_contiguous' if nn else 'm_grouped_fp8_gemm_nt_contiguous'
        else:
            da, db = a.clone(), b
            if not psum:
                a[row_kind == -1] = float('nan')
            a_arg, b_arg = a, (b.mT.contiguous() if nn else b)
            name = 'm_grouped_bf16_gemm_nn_contiguous' if nn else 'm_grouped_bf16_gemm_nt_contiguous'
        base, d = sentinel(m, n, dtype=out_dtype)
        kw = dict(use_psum_layout=psum, ensure_zero_padding=ensure_zero)
        if psum and not nn and ms[0] > 0:
            kw['expected_m_for_psum_layout'] = ms[0]
        inputs = Snapshot(a_arg, b_arg, layout)
        getattr(dg, name)(a_arg, b_arg, d, layout, **kw)
        inputs.assert_unchanged('an input')
    finally:
        dg.set_mk_alignment_for_contiguous_layout(old_al)
    for gi in range(len(ms)):
        rows = row_kind == gi
        if rows.any():
            check_close(d[rows], da[rows].double() @ db[gi].double().t(), BF16_TOL, f'{name} group {gi}')
    untouched = row_kind == -1
    zeroed = row_kind == -2
    assert is_sentinel(d[untouched]), 'rows outside every group written'
    if ensure_zero:
        assert (d[zeroed] == 0).all(), 'psum padding rows not zeroed'
    else:
        assert is_sentinel(d[zeroed]), 'psum padding rows written without ensure_zero_padding'


@examples(30)
@given(num_groups=dims(1, 4), max_m=dims(1, 40), n=dims(1, 150), k=dims(1, 300), fp8=st.booleans(),
       data=st.data(), out_dtype=st.sampled_from([BF, F32]), impl=BACKENDS, seed=seeds)
def test_m_grouped_masked(num_groups, max_m, n, k, fp8, data, out_dtype, impl, seed):
    """Only rows m < masked_m[g] are computed; the rest of D is neither read nor written (A's
    rows past masked_m hold NaN)."""
    masked = data.draw(st.lists(st.one_of(st.sampled_from([0, max_m]), st.integers(0, max_m)),
                                min_size=num_groups, max_size=num_groups), label='masked_m')
    expected_m = data.draw(st.integers(1, 64), label='expected_m')
    g = torch.Generator().manual_seed(seed)
    a = randn(g, num_groups, max_m, k, dtype=BF)
    b = randn(g, num_groups, n, k, dtype=BF)
    masked_m = torch.tensor(masked, dtype=torch.int32)
    live = torch.arange(max_m)[None, :] < masked_m[:, None]  # [G, max_m]
    if fp8:
        qas = [utils.per_token_cast_to_fp8(a[i], use_ue8m0=False) for i in range(num_groups)]
        qbs = [utils.per_block_cast_to_fp8(b[i], use_ue8m0=False) for i in range(num_groups)]
        qa, sfa = torch.stack([q for q, _ in qas]), torch.stack([s for _, s in qas])
        qb, sfb = torch.stack([q for q, _ in qbs]), torch.stack([s for _, s in qbs])
        da = torch.stack([fp8_dequant_rows(q, s, 128) for q, s in qas])
        db = torch.stack([fp8_dequant_blocks(q, s) for q, s in qbs])
        qa.view(torch.uint8)[~live] = 0x7F  # E4M3 NaN
        sfa[~live] = float('nan')
        a_arg, b_arg, fn = (qa, sfa), (qb, sfb), dg.m_grouped_fp8_gemm_nt_masked
    else:
        da, db = a.clone(), b
        a[~live] = float('nan')
        a_arg, b_arg, fn = a, b, dg.m_grouped_bf16_gemm_nt_masked
    base, d = sentinel(num_groups, max_m, n, dtype=out_dtype)
    inputs = Snapshot(a_arg, b_arg, masked_m)
    with backend(impl):
        fn(a_arg, b_arg, d, masked_m, expected_m)
    inputs.assert_unchanged('an input')
    for gi in range(num_groups):
        mm = masked[gi]
        if mm:
            check_close(d[gi, :mm], da[gi, :mm].double() @ db[gi].double().t(), BF16_TOL, f'group {gi}')
        assert is_sentinel(d[gi, mm:]), f'group {gi}: rows past masked_m written'


@examples(12)
@given(ks=st.lists(st.one_of(st.just(0), st.sampled_from([32, 64, 96, 128, 160, 256])), min_size=1, max_size=3),
       m=dims(1, 40), n=dims(1, 40), c_mode=st.sampled_from(['none', 'separate', 'in_place']), seed=seeds)
def test_k_grouped_bf16_tn(ks, m, n, c_mode, seed):
    """k-grouped weight-gradient GEMM (K alignment 32), empty groups give D[g] = C[g]."""
    g = torch.Generator().manual_seed(seed)
    old_al = dg.get_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(32)
    try:
        a = randn(g, sum(ks), m, dtype=BF)
        b = randn(g, sum(ks), n, dtype=BF)
        ref = torch.zeros(len(ks), m, n, dtype=torch.float64)
        s = 0
        for gi, kk in enumerate(ks):
            ref[gi] = a[s:s + kk].double().t() @ b[s:s + kk].double()
            s += kk
        base, d = sentinel(len(ks), m, n, dtype=F32)
        c = None
        if c_mode != 'none':
            c = randn(g, len(ks), m, n)
            ref += c.double()
            if c_mode == 'in_place':
                d.copy_(c)
                c = d
        dg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, torch.tensor(ks, dtype=torch.int32), c)
    finally:
        dg.set_mk_alignment_for_contiguous_layout(old_al)
    check_close(d, ref, BF16_TOL, 'k_grouped_bf16_gemm_tn_contiguous')


# ---- MQA logits ------------------------------------------------------------------------------------

@st.composite
def kv_ranges(draw, s, sk):
    ks, ke = [], []
    for _ in range(s):
        lo = draw(st.integers(0, sk))
        hi = draw(st.one_of(st.just(lo), st.just(sk), st.integers(lo, sk)))
        ks.append(lo)
        ke.append(hi)
    return ks, ke


@examples(30)
@given(s=dims(1, 12), h=dims(1, 9), d=dims(1, 160), sk=dims(1, 300), data=st.data(), legacy=st.booleans(),
       clean=st.booleans(), compressed=st.booleans(), logits_bf16=st.booleans(), impl=BACKENDS, seed=seeds)
def test_fp8_mqa_logits(s, h, d, sk, data, legacy, clean, compressed, logits_bf16, impl, seed):
    """logits[i, j] = kv_sf[j] * sum_h relu(q[i, h] . kv[j]) * w[i, h] on the visible range
    [ks[i], ke[i]) (empty ranges included); -inf elsewhere with clean_logits; DeepGEMM's padded
    row stride; the compressed form (max_seqlen_k > 0) holds column c = kv row ks[i] + c."""
    ks, ke = data.draw(kv_ranges(s, sk), label='ranges')
    width = max(e - b for b, e in zip(ks, ke))
    max_seqlen_k = data.draw(st.integers(max(width, 1), width + 40), label='max_seqlen_k') if compressed else 0
    g = torch.Generator().manual_seed(seed)
    q = (randn(g, s, h, d) * 2).to(E4M3)
    kv, kv_sf = utils.per_custom_dims_cast_to_fp8(randn(g, sk, d), (0,), False)
    kv_sf = kv_sf.reshape(sk)  # DeepGEMM's formula squeezes it to a scalar when SK = 1
    w = randn(g, s, h)
    logits_dtype = BF if (logits_bf16 and not legacy) else F32
    if logits_dtype == BF and data.draw(st.booleans(), label='bf16 weights'):
        w = w.to(BF)
    tks, tke = torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    inputs = Snapshot(q, kv, kv_sf, w, tks, tke)
    with backend(impl):
        if legacy:
            logits = dg.fp8_mqa_logits(q, (kv, kv_sf), w, tks, tke, clean_logits=clean, max_seqlen_k=max_seqlen_k)
        else:
            logits = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, tks, tke, clean_logits=clean,
                                           max_seqlen_k=max_seqlen_k, logits_dtype=logits_dtype)
    inputs.assert_unchanged('an input')
    cols = max_seqlen_k or sk
    assert logits.shape == (s, cols) and logits.dtype == logits_dtype
    assert logits.stride(1) == 1 and logits.stride(0) % (1024 // logits.element_size()) == 0
    score = torch.einsum('shd,td->sht', q.double(), kv.double()).relu()
    full = (score * w.double().unsqueeze(-1)).sum(1) * kv_sf.double()[None, :]  # [S, SK]
    vis_vals, ref_vals = [], []
    for i in range(s):
        if compressed:
            n_vis = ke[i] - ks[i]
            vis_vals.append(logits[i, :n_vis])
            ref_vals.append(full[i, ks[i]:ke[i]])
            if clean:  # the CPU writes -inf past the range's length (DeepGEMM refuses clean_logits here)
                assert (logits[i, n_vis:] == float('-inf')).all()
        else:
            vis_vals.append(logits[i, ks[i]:ke[i]])
            ref_vals.append(full[i, ks[i]:ke[i]])
            if clean:
                assert (logits[i, :ks[i]] == float('-inf')).all() and (logits[i, ke[i]:] == float('-inf')).all()
    check_close(torch.cat(vis_vals).double(), torch.cat(ref_vals), FP8_TOL if logits_dtype == F32 else 1e-4,
                'mqa logits')


# ---- HC prenorm, einsum ---------------------------------------------------------------------------

@examples(30)
@given(m=dims(0, 40), n=dims(1, 40), k=dims(1, 400), num_splits=st.one_of(st.none(), st.integers(1, 9)),
       pad=st.integers(0, 3), impl=BACKENDS, seed=seeds)
def test_tf32_hc_prenorm_gemm(m, n, k, num_splits, pad, impl, seed):
    """d = a @ b.T and sqr_sum = sum a^2 (float32); with num_splits, split s holds the partial
    sums over DeepGEMM's K split (blocks of 64, nb / num_splits each, one more for the first
    nb % num_splits), splits without blocks are zero."""
    g = torch.Generator().manual_seed(seed)
    a, b = randn(g, m, k, dtype=BF), randn(g, n, k)
    shape = (m,) if num_splits is None else (num_splits, m)
    base, d = sentinel(*shape, n, dtype=F32, pad=pad)
    _, sq = sentinel(*shape, dtype=F32)
    inputs = Snapshot(a, b)
    with backend(impl):
        dg.tf32_hc_prenorm_gemm(a, b, d, sq, num_splits=num_splits)
    inputs.assert_unchanged('an input')
    assert is_sentinel(base[..., n:]), 'row padding of d written'
    if num_splits is None:
        check_close(d, a.double() @ b.double().t(), HC_TOL, 'd')
        check_close(sq, a.double().square().sum(-1), HC_TOL, 'sqr_sum')
        return
    nb = ceil_div(k, 64)
    blk = 0
    for sp in range(num_splits):
        cnt = nb // num_splits + (1 if sp < nb % num_splits else 0)
        lo, hi = blk * 64, min((blk + cnt) * 64, k)
        blk += cnt
        if cnt == 0:
            assert (d[sp] == 0).all() and (sq[sp] == 0).all(), f'split {sp} without blocks not zero'
            continue
        check_close(d[sp], a[:, lo:hi].double() @ b[:, lo:hi].double().t(), HC_TOL, f'd split {sp}')
        check_close(sq[sp], a[:, lo:hi].double().square().sum(-1), HC_TOL, f'sqr_sum split {sp}')


@examples(30)
@given(expr=st.sampled_from(['bmk,bnk->mn', 'bhr,hdr->bhd', 'bhd,hdr->bhr']), x=dims(1, 6), y=dims(1, 5),
       p=dims(1, 40), q=dims(1, 70), out_f32=st.booleans(), acc=st.sampled_from(['none', 'separate', 'in_place']),
       slice_b=st.booleans(), pad=st.integers(0, 2), seed=seeds)
def test_einsum(expr, x, y, p, q, out_f32, acc, slice_b, pad, seed):
    g = torch.Generator().manual_seed(seed)
    kw = {}
    if expr == 'bmk,bnk->mn':  # x = S, p = M, y * 8 = N, q = K
        a, b = randn(g, x, p, q, dtype=BF), randn(g, x, y * 8, q, dtype=BF)
        ref = torch.einsum(expr, a.double(), b.double())
        out_dtype = F32 if out_f32 else BF
        d = torch.empty(p, y * 8, dtype=out_dtype)
        d.view(_SENTINEL[out_dtype][0]).fill_(_SENTINEL[out_dtype][1])
        base, pad = d, 0
        if out_dtype == F32 and acc != 'none':
            c = randn(g, p, y * 8)
            ref = ref + c.double()
            if acc == 'in_place':
                d.copy_(c)
                c = d
            kw['c'] = c
    else:
        bsz, h = x, y
        r, dd = (p, q) if expr == 'bhr,hdr->bhd' else (q, p)
        a = randn(g, bsz, h, r if expr == 'bhr,hdr->bhd' else dd, dtype=BF)
        if slice_b:  # b may be a slice such as fy[:, :, :R]
            b = randn(g, h, dd, r + 5, dtype=BF)[:, :, :r]
        else:
            b = randn(g, h, dd, r, dtype=BF)
        ref = torch.einsum(expr, a.double(), b.double())
        base, d = sentinel(*ref.shape, dtype=BF, pad=pad)
    inputs = Snapshot(a, b, kw.get('c') if acc == 'separate' else None)
    dg.einsum(expr, a, b, d, **kw)
    inputs.assert_unchanged('an input')
    check_close(d, ref, BF16_TOL, f'einsum {expr}')
    if pad:
        assert is_sentinel(base[..., d.shape[-1]:]), 'padding of d written'


@examples(10)
@given(bsz=dims(1, 6), h=dims(1, 3), r=st.sampled_from([128, 256]), dd=dims(1, 140), seed=seeds)
def test_fp8_einsum_bhr_hdr(bsz, h, r, dd, seed):
    g = torch.Generator().manual_seed(seed)
    x = randn(g, bsz, h, r, dtype=BF)
    y = randn(g, h, dd, r, dtype=BF)
    qx, sx = utils.per_token_cast_to_fp8(x.view(bsz * h, r), use_ue8m0=False)
    qy = [utils.per_block_cast_to_fp8(y[i], use_ue8m0=False) for i in range(h)]
    _, z = sentinel(bsz, h, dd)
    dg.fp8_einsum('bhr,hdr->bhd', (qx.view(bsz, h, r), sx.view(bsz, h, -1)),
                  (torch.stack([q for q, _ in qy]), torch.stack([s for _, s in qy])), z)
    dx = fp8_dequant_rows(qx, sx, 128).view(bsz, h, r)
    dy = torch.stack([fp8_dequant_blocks(q, s) for q, s in qy])
    check_close(z, torch.einsum('bhr,hdr->bhd', dx.double(), dy.double()), BF16_TOL, 'fp8_einsum')


# ---- casts and scale-factor layouts -----------------------------------------------------------------

def same_bits(x, y, what):
    assert x.dtype == y.dtype and x.shape == y.shape, (what, x.dtype, y.dtype, x.shape, y.shape)
    assert x.numel() == 0 or torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), f'{what}: bits differ'


def cast_sample(g, m, k, dtype, zero_rows):
    """Rows of very different magnitudes (2^-20 .. 2^20), some all-zero groups, as test_utils."""
    x = randn(g, m, k) * torch.exp2(torch.randint(-20, 21, (m, 1), generator=g).float())
    if zero_rows and m:
        x[::3, : min(k, 130)] = 0
    return x.to(dtype)


@examples(40)
@given(m=dims(0, 20), k=dims(1, 520), gran_k=st.sampled_from([32, 64, 128]), use_ue8m0=st.booleans(),
       packed=st.booleans(), dtype=st.sampled_from([F32, BF]), zero_rows=st.booleans(), seed=seeds)
def test_per_token_cast_to_fp8(m, k, gran_k, use_ue8m0, packed, dtype, zero_rows, seed):
    """Bit for bit DeepGEMM's formula; packed UE8M0 needs use_ue8m0 (otherwise ValueError naming
    'use_packed_ue8m0') and pads the last word with 1.0."""
    x = cast_sample(torch.Generator().manual_seed(seed), m, k, dtype, zero_rows)
    snap = Snapshot(x)
    if packed and not use_ue8m0:
        with pytest.raises(ValueError, match="per_token_cast_to_fp8: argument 'use_packed_ue8m0'"):
            utils.per_token_cast_to_fp8(x, use_ue8m0, gran_k=gran_k, use_packed_ue8m0=True)
        snap.assert_unchanged()
        return
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0, gran_k=gran_k, use_packed_ue8m0=packed)
    snap.assert_unchanged()
    rq, rsf = ref_per_token_cast_to_fp8(x, use_ue8m0, gran_k, packed)
    same_bits(q, rq, 'data')
    same_bits(sf, rsf, 'scales')


@examples(25)
@given(m=dims(1, 260), k=dims(1, 260), use_ue8m0=st.booleans(), dtype=st.sampled_from([F32, BF]),
       zero_rows=st.booleans(), seed=seeds)
def test_per_block_cast_to_fp8(m, k, use_ue8m0, dtype, zero_rows, seed):
    x = cast_sample(torch.Generator().manual_seed(seed), m, k, dtype, zero_rows)
    q, sf = utils.per_block_cast_to_fp8(x, use_ue8m0)
    rq, rsf = ref_per_block_cast_to_fp8(x, use_ue8m0)
    same_bits(q, rq, 'data')
    same_bits(sf, rsf, 'scales')


@examples(15)
@given(blocks=dims(1, 3), n=dims(1, 70), use_ue8m0=st.booleans(), seed=seeds)
def test_per_channel_cast_to_fp8(blocks, n, use_ue8m0, seed):
    x = cast_sample(torch.Generator().manual_seed(seed), blocks * 128, n, F32, False)
    q, sf = utils.per_channel_cast_to_fp8(x, use_ue8m0)
    rq, rsf = ref_per_channel_cast_to_fp8(x, use_ue8m0)
    same_bits(q, rq, 'data')
    same_bits(sf, rsf, 'scales')


@examples(15)
@given(shape=st.lists(dims(2, 9), min_size=2, max_size=3), data=st.data(), use_ue8m0=st.booleans(), seed=seeds)
def test_per_custom_dims_cast_to_fp8(shape, data, use_ue8m0, seed):
    nd = len(shape)
    kept = data.draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd - 1, unique=True), label='dims')
    x = randn(torch.Generator().manual_seed(seed), *shape)
    q, sf = utils.per_custom_dims_cast_to_fp8(x, tuple(sorted(kept)), use_ue8m0)
    rq, rsf = ref_per_custom_dims_cast_to_fp8(x, tuple(sorted(kept)), use_ue8m0)
    same_bits(q, rq, 'data')
    same_bits(sf, rsf, 'scales')


@examples(25)
@given(m=dims(1, 12), k2=dims(1, 160), gran_k=st.sampled_from([32, 64, 128]), use_ue8m0=st.booleans(),
       packed=st.booleans(), seed=seeds)
def test_per_token_cast_to_fp4_and_back(m, k2, gran_k, use_ue8m0, packed, seed):
    k = 2 * k2
    packed = packed and use_ue8m0
    x = cast_sample(torch.Generator().manual_seed(seed), m, k, F32, True)
    q, sf = utils.per_token_cast_to_fp4(x, use_ue8m0, gran_k=gran_k, use_packed_ue8m0=packed)
    rq, rsf = ref_per_token_cast_to_fp4(x, use_ue8m0, gran_k, packed)
    same_bits(q, rq, 'data')
    same_bits(sf, rsf, 'scales')
    back = utils.cast_back_from_fp4(q, sf, gran_k=gran_k, use_packed_ue8m0=packed)
    same_bits(back, fp4_dequant(q, sf, gran_k, packed), 'cast back')


@examples(25)
@given(exps=st.lists(st.integers(-126, 127), min_size=1, max_size=40), zeros=st.booleans(),
       scale=st.floats(min_value=0.0, max_value=3e38, allow_nan=False, allow_infinity=False))
def test_ue8m0_helpers(exps, zeros, scale):
    """ceil_to_ue8m0 as DeepGEMM's formula (any finite input); pack / unpack round trip."""
    x = torch.tensor([scale] + [2.0 ** e * 1.3 for e in exps])
    same_bits(utils.ceil_to_ue8m0(x), ref_ceil_to_ue8m0(x), 'ceil_to_ue8m0')
    p2 = ref_ceil_to_ue8m0(torch.tensor([2.0 ** e for e in exps] * 4).view(4, -1))
    if zeros:
        p2[0, 0] = 0  # zero packs as byte 0
    packed = utils.pack_ue8m0_to_int(p2) if p2.size(-1) % 4 == 0 else None
    if packed is not None:
        same_bits(packed, ref_pack_ue8m0_to_int(p2), 'pack')
        same_bits(utils.unpack_ue8m0_from_int(packed), ref_unpack_ue8m0_from_int(packed), 'unpack')


def tma_mn_major_strides(shape, elem):
    a = align(shape[-2], 16 // elem)
    return (1, a) if len(shape) == 2 else (a * shape[-1], 1, a)


@st.composite
def sf_tensors(draw, powers_of_two):
    """FLOAT32 scales [(G,) MN, SK] as K-major, MN-major or strided slices."""
    groups = draw(st.one_of(st.none(), st.integers(1, 3)))
    mn, sk = draw(dims(1, 40)), draw(dims(1, 12))
    seed = draw(seeds)
    g = torch.Generator().manual_seed(seed)
    shape = (mn, sk) if groups is None else (groups, mn, sk)
    sf = torch.rand(shape, generator=g) * 10 + 1e-3
    if powers_of_two:
        sf = ref_ceil_to_ue8m0(sf)
    form = draw(st.sampled_from(['k_major', 'mn_major', 'slice']))
    if form == 'mn_major':
        sf = sf.mT.contiguous().mT
    elif form == 'slice':
        big = torch.zeros(*shape[:-1], sk * 2)
        big[..., ::2] = sf
        sf = big[..., ::2]
    return sf


@examples(30)
@given(sf=sf_tensors(powers_of_two=True))
def test_sf_layouts(sf):
    """get_mn_major_tma_aligned_tensor and its packed UE8M0 form: DeepGEMM's values, shapes and
    TMA-aligned MN-major strides, from scales of any strides; transform_sf_into_required_layout
    for DeepGEMM's 1D2D sfa (SM100: packed) and, with disable_ue8m0_cast, SM90's MN-major copy."""
    snap = Snapshot(sf)
    out = dg.get_mn_major_tma_aligned_tensor(sf)
    assert torch.equal(out, sf) and out.stride() == tma_mn_major_strides(sf.shape, 4)
    packed = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    sk = sf.size(-1)
    padded = torch.zeros(*sf.shape[:-1], align(sk, 4))
    padded[..., :sk] = sf
    assert packed.dtype == torch.int32 and packed.shape == (*sf.shape[:-1], ceil_div(sk, 4))
    assert packed.stride() == tma_mn_major_strides(packed.shape, 4)
    assert torch.equal(packed, ref_pack_ue8m0_to_int(padded))
    mn = sf.size(-2)
    ng = sf.size(0) if sf.dim() == 3 else None
    t = dg.transform_sf_into_required_layout(sf, mn, sk * 128, (1, 128, 128), num_groups=ng, is_sfa=True)
    assert torch.equal(t, packed) and t.stride() == packed.stride()
    t2 = dg.transform_sf_into_required_layout(sf, mn, sk * 128 - 5, (1, 128), num_groups=ng, disable_ue8m0_cast=True)
    assert torch.equal(t2, sf) and t2.stride() == out.stride()
    snap.assert_unchanged('sf')


@examples(20)
@given(mn=dims(1, 300), k=dims(1, 600), seed=seeds)
def test_transform_sfb_per_block(mn, k, seed):
    """DeepGEMM's per-block sfb [ceil(mn/128), ceil(k/128)] -> rows broadcast to mn, packed."""
    g = torch.Generator().manual_seed(seed)
    sf = ref_ceil_to_ue8m0(torch.rand(ceil_div(mn, 128), ceil_div(k, 128), generator=g) * 10 + 1e-3)
    t = dg.transform_sf_into_required_layout(sf, mn, k, (1, 128, 128), is_sfa=False)
    want = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf.repeat_interleave(128, 0)[:mn].contiguous())
    assert torch.equal(t, want) and t.stride() == want.stride()
    t2 = dg.transform_sf_into_required_layout(sf, mn, k, (128, 128), disable_ue8m0_cast=True)
    assert torch.equal(t2, sf) and t2.stride() == sf.stride()


@examples(20)
@given(x=st.integers(0, 2 ** 20), elem=st.sampled_from([1, 2, 4, 8, 16]))
def test_get_tma_aligned_size(x, elem):
    assert dg.get_tma_aligned_size(x, elem) == align(x, 16 // elem)


# ---- invalid inputs ------------------------------------------------------------------------------
#
# For each family and each of its mutations (a pytest parameter, so every mutation runs), hypothesis
# draws a valid call (keyword arguments by DeepGEMM's names) and spoils one argument. A builder
# returns the function, the spoiled keyword arguments, the exception type the README promises
# (dtype -> TypeError; shape, layout, value, device -> ValueError; a wrong Python type or tuple
# length -> TypeError) and the argument names of which the message must quote one.

E_TYPE, E_VALUE = (TypeError,), (ValueError,)
HUGE_INTS = st.one_of(st.integers(2 ** 31, 2 ** 63 - 1), st.integers(-(2 ** 63), -(2 ** 31) - 1),
                      st.integers(2 ** 63, 2 ** 80), st.integers(-(2 ** 80), -(2 ** 63) - 1))
NONPOS_INTS = st.one_of(st.sampled_from([0, -1, -128, -(2 ** 31)]), st.integers(-(2 ** 31), 0))
NOT_TENSORS = st.sampled_from([None, 3, 1.5, 'x', [[1.0]], (1, 2)])


def expect_rejected(fn, kw, exc, names, keep=()):
    """fn(**kw) raises exactly one of exc, naming fn and one of names; no tensor changes."""
    snap = Snapshot(kw, keep)
    with pytest.raises(Exception) as info:
        fn(**kw)
    err, msg = info.value, str(info.value)
    try:
        note(f'{type(err).__name__}: {msg}')
    except hypothesis.errors.InvalidArgument:  # a plain test (the integer-argument ones)
        pass
    snap.assert_unchanged('a tensor of the rejected call (output or input)')
    assert type(err) in exc, f'{type(err).__name__} (want {[e.__name__ for e in exc]}): {msg}'
    quoted = [n[1:] if n.startswith('~') else f"'{n}'" for n in names]  # '~words': the words themselves
    assert any(q in msg for q in quoted), f'the message names none of {names}: {msg}'
    assert fn.__name__ in msg, f'the message does not name {fn.__name__}: {msg}'


def other_dtype(draw, t, choices):
    return t.to(draw(st.sampled_from([c for c in choices if c != t.dtype])))


def spoil_ndim(draw, t):
    return t.unsqueeze(0) if t.dim() < 2 or draw(st.booleans()) else t.flatten()


def strided_last(t):
    """t's values with t's shape and stride 2 along the last dimension."""
    if t.dtype in _SENTINEL:
        base = sentinel(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[0]
    else:
        base = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    v = base[..., ::2]
    v.copy_(t)
    return v


def meta_like(t):
    return torch.empty(t.shape, dtype=t.dtype, device='meta')


def reject_cases(mutations, builder, n=4):
    """A test over every mutation, n examples each (scaled by the profile)."""
    @pytest.mark.parametrize('what', mutations)
    @examples(n)
    @given(data=st.data())
    def test(what, data):
        fn, kw, exc, names, keep = data.draw(builder(what), label='case')
        expect_rejected(fn, kw, exc, names, keep)
    return test


BF16_GEMM_MUTATIONS = ['a_dtype', 'b_dtype', 'd_dtype', 'c_dtype', 'a_ndim', 'b_ndim', 'd_ndim', 'k', 'm', 'n',
                       'd_shape', 'c_shape', 'd_stride', 'd_broadcast', 'c_overlap', 'd_overlaps_a',
                       'd_overlaps_b', 'not_tensor', 'meta', 'absurd_m', 'absurd_n']


@st.composite
def bad_bf16_gemm(draw, what):
    layout = draw(st.sampled_from(LAYOUTS))
    two = what in ('d_stride', 'd_broadcast', 'c_overlap')
    m, n, k = draw(dims(1 + two, 24)), draw(dims(1 + two, 24)), draw(dims(1, 64))
    g = torch.Generator().manual_seed(draw(seeds))
    a0, b0 = randn(g, m, k, dtype=BF), randn(g, n, k, dtype=BF)
    a, b = gemm_operands(layout, a0, b0)
    out_dtype = draw(st.sampled_from([BF, F32]))
    base, d = sentinel(m, n, dtype=out_dtype, pad=1)
    kw = dict(a=a, b=b, d=d)
    if draw(st.booleans()) or what in ('c_shape', 'c_overlap'):
        kw['c'] = randn(g, m, n, dtype=out_dtype)
    fn = getattr(dg, f'bf16_gemm_{layout}')
    a_shape = (lambda mm, kk: (mm, kk)) if layout[0] == 'n' else (lambda mm, kk: (kk, mm))
    b_shape = (lambda nn, kk: (kk, nn)) if layout[1] == 'n' else (lambda nn, kk: (nn, kk))
    if what in ('a_dtype', 'b_dtype'):
        kw[what[0]] = other_dtype(draw, kw[what[0]], [F32, torch.float16, torch.float64, torch.int32, E4M3])
        return fn, kw, E_TYPE, [what[0]], base
    if what == 'd_dtype':
        kw['d'] = sentinel(m, n, dtype=draw(st.sampled_from([torch.float16, torch.int32, torch.float64])))[1]
        return fn, kw, E_TYPE, ['d'], base
    if what == 'c_dtype':
        kw['c'] = randn(g, m, n, dtype=F32 if out_dtype == BF else BF)
        return fn, kw, E_TYPE, ['c'], base
    if what.endswith('_ndim'):
        kw[what[0]] = spoil_ndim(draw, kw[what[0]])
        return fn, kw, E_VALUE, [what[0]], base
    if what in ('k', 'm', 'n'):
        delta = draw(st.sampled_from([-1, 1, 2, 64]))
        mm, nn, kk = (max(m + delta * (what == 'm'), 0), max(n + delta * (what == 'n'), 0),
                      max(k + delta * (what == 'k'), 0))
        if what in ('k', 'm'):
            kw['a'] = randn(g, *a_shape(mm, kk), dtype=BF)
        else:
            kw['b'] = randn(g, *b_shape(nn, kk), dtype=BF)
        return fn, kw, E_VALUE, {'k': ['a', 'b'], 'm': ['a', 'd'], 'n': ['b', 'd']}[what], base
    if what == 'd_shape':
        kw['d'] = sentinel(m + draw(st.sampled_from([0, 1])), n + 1, dtype=out_dtype)[1]
        return fn, kw, E_VALUE, ['d'], base
    if what == 'c_shape':
        kw['c'] = randn(g, m, n + 1, dtype=out_dtype)
        return fn, kw, E_VALUE, ['c'], base
    if what == 'd_stride':      # unit stride along N is required
        kw['d'] = strided_last(d)
        return fn, kw, E_VALUE, ['d'], base
    if what == 'd_broadcast':   # an output whose rows are one and the same memory
        kw['d'] = sentinel(1, n, dtype=out_dtype)[1].expand(m, n)
        return fn, kw, E_VALUE, ['d'], base
    if what == 'c_overlap':     # c overlapping d without being the same view
        kw['c'] = base[:, 1:n + 1]
        return fn, kw, E_VALUE, ['c', 'd'], base
    if what in ('d_overlaps_a', 'd_overlaps_b'):  # d (BF16) written over the memory of an input
        x = what[-1]
        flat = kw[x].flatten()
        start = draw(st.integers(0, max(flat.numel() - 1, 0)))
        store = torch.cat([flat, torch.zeros(m * n, dtype=BF)])
        kw[x] = store[:flat.numel()].view(kw[x].shape)
        kw['d'] = store[start:start + m * n].view(m, n)
        kw.pop('c', None)
        return fn, kw, E_VALUE, ['d'], base
    if what == 'not_tensor':
        x = draw(st.sampled_from(['a', 'b', 'd']))
        kw[x] = draw(NOT_TENSORS)
        return fn, kw, E_TYPE, [x], base
    if what == 'meta':
        x = draw(st.sampled_from(['a', 'b', 'd']))
        kw[x] = meta_like(kw[x])
        return fn, kw, E_VALUE, [x], base
    # absurd sizes: a broadcast view with 2^33.. rows, refused from its shape alone
    huge = draw(st.integers(2 ** 33, 2 ** 50))
    if what == 'absurd_m':
        kw['a'] = torch.zeros(1, 1, dtype=BF).expand(*a_shape(huge, k))
        return fn, kw, E_VALUE, ['a', 'd'], base
    kw['b'] = torch.zeros(1, 1, dtype=BF).expand(*b_shape(huge, k))
    return fn, kw, E_VALUE, ['b', 'd'], base


test_bf16_gemm_rejects = reject_cases(BF16_GEMM_MUTATIONS, bad_bf16_gemm)

RECIPE_MUTATIONS = ['recipe_len', 'recipe_type', 'recipe_nonpos', 'recipe_huge', 'recipe_gran_k', 'recipe_a_len',
                    'recipe_b_type']


def spoil_recipe(draw, kw, what):
    """Bad recipe tuples for an FP8 GEMM whose scales were made for (1, 128, 128)."""
    if what == 'recipe_len':
        kw['recipe'] = tuple(draw(st.lists(st.integers(1, 128), max_size=5).filter(lambda r: len(r) != 3)))
        return E_TYPE, ['recipe']
    if what == 'recipe_type':
        kw['recipe'] = draw(st.sampled_from([(1, 128.0, 128), (1, '128', 128), '1,128,128', 128, (1, None, 128),
                                             {1: 1, 2: 2, 3: 3}]))
        return E_TYPE, ['recipe']
    if what == 'recipe_nonpos':
        r = [1, 128, 128]
        r[draw(st.integers(0, 2))] = draw(NONPOS_INTS)
        kw['recipe'] = tuple(r)
        return E_VALUE, ['recipe']
    if what == 'recipe_huge':  # past a 32-bit int, past a C long too
        r = [1, 128, 128]
        r[draw(st.integers(0, 2))] = draw(HUGE_INTS)
        kw['recipe'] = tuple(r)
        return E_VALUE, ['recipe']
    if what == 'recipe_gran_k':  # scales made for gran_k 128, K > 64
        kw['recipe'] = (1, 128, draw(st.sampled_from([32, 64])))
        return E_VALUE, ['recipe', 'a[1]', 'sfa', 'b[1]', 'sfb']
    if what == 'recipe_a_len':
        kw['recipe_a'] = tuple(draw(st.lists(st.integers(1, 128), max_size=4).filter(lambda r: len(r) != 2)))
        return E_TYPE, ['recipe_a']
    kw['recipe_b'] = draw(st.sampled_from([(1.0, 128), '1,128', 7, (1, 128, 128)]))
    return E_TYPE, ['recipe_b']


FP8_GEMM_MUTATIONS = ['a_not_pair', 'a_triple', 'b_not_pair', 'a_data_dtype', 'b_data_dtype', 'sfa_dtype',
                      'sfb_dtype', 'sfa_none', 'sfb_none', 'sfa_shape', 'sfb_shape', 'd_dtype', 'd_stride',
                      'd_shape', 'k'] + RECIPE_MUTATIONS


@st.composite
def bad_fp8_gemm(draw, what):
    layout = draw(st.sampled_from(LAYOUTS))
    m = draw(dims(1, 24))
    n = draw(dims(2 if what == 'd_stride' else 1, 140))
    k = draw(dims(65 if what == 'recipe_gran_k' else 1, 300))
    g = torch.Generator().manual_seed(draw(seeds))
    ue8m0 = draw(st.booleans())
    (qa, sfa), (qb, sfb), _, _ = fp8_operands(g, m, n, k, ue8m0)
    ta, tb = layout[0] == 't', layout[1] == 'n'
    out_dtype = draw(st.sampled_from([BF, F32]))
    base, d = sentinel(m, n, dtype=out_dtype, pad=1)
    kw = dict(a=quant_pair(qa, sfa, ta), b=quant_pair(qb, sfb, tb), d=d)
    if draw(st.booleans()):
        kw['recipe'] = (1, 128, 128)
    fn = getattr(dg, f'fp8_gemm_{layout}')
    if what == 'a_not_pair':
        kw['a'] = kw['a'][0]
        return fn, kw, E_TYPE, ['a'], base
    if what == 'b_not_pair':
        kw['b'] = draw(st.sampled_from([kw['b'][0], None, 5]))
        return fn, kw, E_TYPE, ['b'], base
    if what == 'a_triple':
        kw['a'] = kw['a'] + (kw['a'][1],)
        return fn, kw, E_TYPE, ['a'], base
    if what in ('a_data_dtype', 'b_data_dtype'):
        x = what[0]
        kw[x] = (other_dtype(draw, kw[x][0], [BF, F32, torch.float16, torch.int32]), kw[x][1])
        return fn, kw, E_TYPE, [x, f'{x}[0]'], base
    if what in ('sfa_dtype', 'sfb_dtype'):
        x = what[2]
        kw[x] = (kw[x][0], other_dtype(draw, kw[x][1], [BF, torch.float16, torch.float64, E4M3]))
        return fn, kw, E_TYPE, [f'{x}[1]', f'sf{x}'], base
    if what in ('sfa_none', 'sfb_none'):
        x = what[2]
        kw[x] = (kw[x][0], None)
        return fn, kw, E_TYPE, [f'{x}[1]', f'sf{x}'], base
    if what == 'sfa_shape':
        bad = torch.cat([sfa, sfa[:, :1]], 1) if m < 2 or draw(st.booleans()) else sfa[:-1]
        kw['a'] = quant_pair(qa, bad, ta)
        return fn, kw, E_VALUE, ['a[1]', 'sfa'], base
    if what == 'sfb_shape':
        bad = torch.cat([sfb, sfb[:1]], 0) if draw(st.booleans()) else torch.cat([sfb, sfb[:, :1]], 1)
        kw['b'] = quant_pair(qb, bad, tb)
        return fn, kw, E_VALUE, ['b[1]', 'sfb'], base
    if what == 'd_dtype':
        kw['d'] = sentinel(m, n, dtype=draw(st.sampled_from([torch.float16, torch.int32, torch.float64])))[1]
        return fn, kw, E_TYPE, ['d'], base
    if what == 'd_stride':
        kw['d'] = strided_last(d)
        return fn, kw, E_VALUE, ['d'], base
    if what == 'd_shape':
        kw['d'] = sentinel(m + 1, n, dtype=out_dtype)[1]
        return fn, kw, E_VALUE, ['d'], base
    if what == 'k':  # b quantized from another K
        k2 = draw(st.integers(1, 300).filter(lambda x: x != k))
        _, (qb2, sfb2), _, _ = fp8_operands(g, 1, n, k2, ue8m0)
        kw['b'] = quant_pair(qb2, sfb2, tb)
        return fn, kw, E_VALUE, ['a', 'b', 'a[0]', 'b[0]', 'a[1]', 'b[1]', 'sfa', 'sfb'], base
    return (fn, kw) + spoil_recipe(draw, kw, what) + (base,)


test_fp8_gemm_rejects = reject_cases(FP8_GEMM_MUTATIONS, bad_fp8_gemm)

M_GROUPED_CONTIGUOUS_MUTATIONS = ['layout_dtype', 'layout_len', 'layout_value', 'layout_stride', 'layout_ndim',
                                  'layout_not_tensor', 'a_mn_major', 'b_ndim', 'k', 'd_rows', 'd_dtype',
                                  'expected_m']


@st.composite
def bad_m_grouped_contiguous(draw, what):
    fp8, psum = draw(st.booleans()), draw(st.booleans())
    nn = draw(st.booleans()) and what != 'expected_m'
    fp8 = fp8 and what != 'k'
    lo = 2 if what in ('layout_stride', 'a_mn_major') else 1
    ms = draw(st.lists(dims(lo, 130), min_size=1, max_size=3))
    n, k = draw(dims(1, 16)), draw(dims(lo, 160))
    al = dg.get_mk_alignment_for_contiguous_layout()
    m, layout, _, _ = contiguous_layout(ms, al, psum, False)
    if what == 'layout_stride' and psum and len(ms) < 2:
        psum = False  # a non-contiguous layout needs two entries
        m, layout, _, _ = contiguous_layout(ms, al, psum, False)
    num_groups = len(ms)
    g = torch.Generator().manual_seed(draw(seeds))
    a = randn(g, m, k, dtype=BF)
    b = randn(g, num_groups, n, k, dtype=BF)
    if fp8:
        a_arg = utils.per_token_cast_to_fp8(a, use_ue8m0=False)
        qbs = [utils.per_block_cast_to_fp8(b[i], use_ue8m0=False) for i in range(num_groups)]
        qb, sfb = torch.stack([q for q, _ in qbs]), torch.stack([s for _, s in qbs])
        b_arg = (qb.mT.contiguous(), sfb.mT.contiguous()) if nn else (qb, sfb)
    else:
        a_arg, b_arg = a, (b.mT.contiguous() if nn else b)
    fn = getattr(dg, f"m_grouped_{'fp8' if fp8 else 'bf16'}_gemm_{'nn' if nn else 'nt'}_contiguous")
    base, d = sentinel(m, n)
    kw = dict(a=a_arg, b=b_arg, d=d, grouped_layout=layout, use_psum_layout=psum)
    if what == 'layout_dtype':
        kw['grouped_layout'] = other_dtype(draw, layout, [torch.int64, F32, torch.uint8])
        return fn, kw, E_TYPE, ['grouped_layout'], base
    if what == 'layout_len':
        extra = torch.zeros(1, dtype=torch.int32) + (layout[-1] if psum else 0)
        shorter = layout.numel() > 1 and draw(st.booleans())
        kw['grouped_layout'] = layout[:-1] if shorter else torch.cat([layout, extra])
        return fn, kw, E_VALUE, ['grouped_layout'], base
    if what == 'layout_value':
        bad = layout.clone()
        i = draw(st.integers(0, bad.numel() - 1))
        if psum:  # an end past M, or before its group's start
            bad[i] = draw(st.sampled_from([m + 1, m + 1000, 2 ** 31 - 1, -1, -(2 ** 31)]))
        else:     # a group index out of [-1, G)
            bad[i] = draw(st.sampled_from([num_groups, num_groups + 7, 2 ** 31 - 1, -2, -(2 ** 31)]))
        kw['grouped_layout'] = bad
        return fn, kw, E_VALUE, ['grouped_layout'], base
    if what == 'layout_stride':
        kw['grouped_layout'] = strided_last(layout)
        return fn, kw, E_VALUE, ['grouped_layout'], base
    if what == 'layout_ndim':
        kw['grouped_layout'] = layout.unsqueeze(0)
        return fn, kw, E_VALUE, ['grouped_layout'], base
    if what == 'layout_not_tensor':
        kw['grouped_layout'] = draw(st.sampled_from([None, layout.tolist(), 3]))
        return fn, kw, E_TYPE, ['grouped_layout'], base
    if what == 'a_mn_major':  # A must be K-major
        kw['a'] = (k_major_or_mn_major(a_arg[0], True), a_arg[1]) if fp8 else k_major_or_mn_major(a, True)
        return fn, kw, E_VALUE, ['a', 'a[0]'], base
    if what == 'b_ndim':
        kw['b'] = (b_arg[0][0], b_arg[1][0]) if fp8 else b_arg[0]
        return fn, kw, E_VALUE, ['b', 'b[0]', 'b[1]', 'sfb'], base
    if what == 'k':
        kw['b'] = randn(g, num_groups, *((k + 1, n) if nn else (n, k + 1)), dtype=BF)
        return fn, kw, E_VALUE, ['a', 'b'], base
    if what == 'd_rows':
        kw['d'] = sentinel(m + 1, n)[1]
        return fn, kw, E_VALUE, ['d', 'a', 'grouped_layout'], base
    if what == 'd_dtype':
        kw['d'] = sentinel(m, n, dtype=draw(st.sampled_from([torch.float16, torch.int32, torch.float64])))[1]
        return fn, kw, E_TYPE, ['d'], base
    # expected_m_for_psum_layout: positive, and a hint for the psum layout only
    kw['expected_m_for_psum_layout'] = draw(NONPOS_INTS if psum else st.integers(1, 2 ** 31 - 1))
    return fn, kw, E_VALUE, ['expected_m_for_psum_layout'], base


test_m_grouped_contiguous_rejects = reject_cases(M_GROUPED_CONTIGUOUS_MUTATIONS, bad_m_grouped_contiguous)

M_GROUPED_MASKED_MUTATIONS = ['masked_dtype', 'masked_len', 'masked_value', 'masked_stride', 'masked_not_tensor',
                              'expected_m', 'a_ndim', 'd_shape', 'b_groups', 'a_mn_major', 'd_dtype']


@st.composite
def bad_m_grouped_masked(draw, what):
    fp8 = draw(st.booleans()) and what != 'a_mn_major'
    two = what in ('masked_stride', 'a_mn_major')
    num_groups, max_m = draw(dims(1 + two, 4)), draw(dims(1 + two, 24))
    n, k = draw(dims(1, 24)), draw(dims(1 + two, 160))
    masked = draw(st.lists(st.integers(0, max_m), min_size=num_groups, max_size=num_groups))
    g = torch.Generator().manual_seed(draw(seeds))
    a = randn(g, num_groups, max_m, k, dtype=BF)
    b = randn(g, num_groups, n, k, dtype=BF)
    if fp8:
        qas = [utils.per_token_cast_to_fp8(a[i], use_ue8m0=False) for i in range(num_groups)]
        qbs = [utils.per_block_cast_to_fp8(b[i], use_ue8m0=False) for i in range(num_groups)]
        a_arg = (torch.stack([q for q, _ in qas]), torch.stack([s for _, s in qas]))
        b_arg = (torch.stack([q for q, _ in qbs]), torch.stack([s for _, s in qbs]))
        fn = dg.m_grouped_fp8_gemm_nt_masked
    else:
        a_arg, b_arg, fn = a, b, dg.m_grouped_bf16_gemm_nt_masked
    base, d = sentinel(num_groups, max_m, n)
    mm = torch.tensor(masked, dtype=torch.int32)
    kw = dict(a=a_arg, b=b_arg, d=d, masked_m=mm, expected_m=draw(st.integers(1, 64)))
    if what == 'masked_dtype':
        kw['masked_m'] = other_dtype(draw, mm, [torch.int64, F32, torch.int8])
        return fn, kw, E_TYPE, ['masked_m'], base
    if what == 'masked_len':
        kw['masked_m'] = mm[:-1] if num_groups > 1 and draw(st.booleans()) else torch.cat([mm, mm[:1]])
        return fn, kw, E_VALUE, ['masked_m'], base
    if what == 'masked_value':  # outside [0, max_m]
        bad = mm.clone()
        bad[draw(st.integers(0, num_groups - 1))] = draw(st.one_of(st.integers(max_m + 1, 2 ** 31 - 1),
                                                                 st.integers(-(2 ** 31), -1)))
        kw['masked_m'] = bad
        return fn, kw, E_VALUE, ['masked_m'], base
    if what == 'masked_stride':
        kw['masked_m'] = strided_last(mm)
        return fn, kw, E_VALUE, ['masked_m'], base
    if what == 'masked_not_tensor':
        kw['masked_m'] = draw(st.sampled_from([None, masked, 3]))
        return fn, kw, E_TYPE, ['masked_m'], base
    if what == 'expected_m':
        kw['expected_m'] = draw(NONPOS_INTS)
        return fn, kw, E_VALUE, ['expected_m'], base
    if what == 'a_ndim':
        kw['a'] = (a_arg[0][0], a_arg[1][0]) if fp8 else a[0]
        return fn, kw, E_VALUE, ['a', 'a[0]', 'a[1]', 'sfa'], base
    if what == 'd_shape':
        kw['d'] = sentinel(num_groups, max_m + draw(st.sampled_from([0, 1])), n + 1)[1]
        return fn, kw, E_VALUE, ['d'], base
    if what == 'b_groups':
        kw['b'] = (torch.cat([b_arg[0], b_arg[0][:1]]), torch.cat([b_arg[1], b_arg[1][:1]])) if fp8 else \
            torch.cat([b, b[:1]])
        return fn, kw, E_VALUE, ['a', 'b', 'b[0]', 'masked_m'], base
    if what == 'a_mn_major':
        kw['a'] = a.mT.contiguous().mT
        return fn, kw, E_VALUE, ['a'], base
    kw['d'] = sentinel(num_groups, max_m, n, dtype=draw(st.sampled_from([torch.float16, torch.int32])))[1]
    return fn, kw, E_TYPE, ['d'], base


test_m_grouped_masked_rejects = reject_cases(M_GROUPED_MASKED_MUTATIONS, bad_m_grouped_masked)

MQA_MUTATIONS = ['q_noncontig', 'q_dtype', 'q_ndim', 'kv_sf_len', 'kv_sf_dtype', 'kv_dim', 'kv_not_pair',
                 'weights_shape', 'weights_dtype', 'ks_dtype', 'ke_past_sk', 'ks_past_ke', 'ks_len',
                 'max_seqlen_k_neg', 'max_seqlen_k_small', 'logits_dtype_name', 'not_tensor']


@st.composite
def bad_mqa_logits(draw, what):
    legacy = draw(st.booleans()) and what != 'logits_dtype_name'
    two = what in ('q_noncontig',)
    s, h, d, sk = draw(dims(1, 8)), draw(dims(1 + two, 6)), draw(dims(1 + two, 64)), draw(dims(1, 80))
    ks, ke = draw(kv_ranges(s, sk))
    if what == 'max_seqlen_k_small':
        ks[0], ke[0] = 0, max(sk, 2)
        sk = ke[0]
    g = torch.Generator().manual_seed(draw(seeds))
    q = randn(g, s, h, d).to(E4M3)
    kv = randn(g, sk, d).to(E4M3)
    kv_sf = torch.rand(sk, generator=g) + 0.5
    w = randn(g, s, h)
    tks, tke = torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    fn = dg.fp8_mqa_logits if legacy else dg.fp8_fp4_mqa_logits
    kw = dict(q=q if legacy else (q, None), kv=(kv, kv_sf), weights=w, cu_seq_len_k_start=tks,
              cu_seq_len_k_end=tke)
    qname = ['q'] if legacy else ['q', 'q[0]']

    def setq(t):
        kw['q'] = t if legacy else (t, None)
    if what == 'q_noncontig':
        setq(randn(g, s, d, h).to(E4M3).transpose(1, 2))
        return fn, kw, E_VALUE, qname, ()
    if what == 'q_dtype':
        setq(other_dtype(draw, q, [BF, F32, torch.float16]))
        return fn, kw, E_TYPE, qname, ()
    if what == 'q_ndim':
        setq(spoil_ndim(draw, q))
        return fn, kw, E_VALUE, qname, ()
    if what == 'kv_sf_len':
        kw['kv'] = (kv, torch.cat([kv_sf, kv_sf[:1]]) if sk < 2 or draw(st.booleans()) else kv_sf[:-1])
        return fn, kw, E_VALUE, ['kv[1]', 'kv_sf'], ()
    if what == 'kv_sf_dtype':
        kw['kv'] = (kv, other_dtype(draw, kv_sf, [BF, torch.float16, torch.float64, torch.int64]))
        return fn, kw, E_TYPE, ['kv[1]', 'kv_sf'], ()
    if what == 'kv_dim':  # kv's head dim differs from q's
        kw['kv'] = (randn(g, sk, d + 1).to(E4M3), kv_sf)
        return fn, kw, E_VALUE, ['q', 'kv', 'kv[0]'], ()
    if what == 'kv_not_pair':
        kw['kv'] = draw(st.sampled_from([kv, (kv,), (kv, kv_sf, kv_sf), None]))
        return fn, kw, E_TYPE, ['kv'], ()
    if what == 'weights_shape':
        kw['weights'] = randn(g, s + draw(st.sampled_from([0, 1])), h + 1)
        return fn, kw, E_VALUE, ['weights'], ()
    if what == 'weights_dtype':
        kw['weights'] = other_dtype(draw, w, [torch.float64, torch.int32] + ([BF] if legacy else []))
        return fn, kw, E_TYPE, ['weights'], ()
    if what == 'ks_dtype':
        x = draw(st.sampled_from(['cu_seq_len_k_start', 'cu_seq_len_k_end']))
        kw[x] = other_dtype(draw, kw[x], [torch.int64, F32, torch.int16])
        return fn, kw, E_TYPE, [x], ()
    if what == 'ke_past_sk':
        bad = tke.clone()
        bad[draw(st.integers(0, s - 1))] = draw(st.integers(sk + 1, 2 ** 31 - 1))
        kw['cu_seq_len_k_end'] = bad
        return fn, kw, E_VALUE, ['cu_seq_len_k_end'], ()
    if what == 'ks_past_ke':
        i = draw(st.integers(0, s - 1))
        bad = tks.clone()
        bad[i] = draw(st.one_of(st.integers(ke[i] + 1, 2 ** 31 - 1), st.integers(-(2 ** 31), -1)))
        kw['cu_seq_len_k_start'] = bad
        return fn, kw, E_VALUE, ['cu_seq_len_k_start', 'cu_seq_len_k_end'], ()
    if what == 'ks_len':
        x = draw(st.sampled_from(['cu_seq_len_k_start', 'cu_seq_len_k_end']))
        kw[x] = torch.cat([kw[x], kw[x][:1]])
        return fn, kw, E_VALUE, [x], ()
    if what == 'max_seqlen_k_neg':
        kw['max_seqlen_k'] = draw(st.integers(-(2 ** 31), -1))
        return fn, kw, E_VALUE, ['max_seqlen_k'], ()
    if what == 'max_seqlen_k_small':  # below row 0's range length
        kw['max_seqlen_k'] = draw(st.integers(1, ke[0] - ks[0] - 1))
        return fn, kw, E_VALUE, ['max_seqlen_k'], ()
    if what == 'logits_dtype_name':
        kw['logits_dtype'] = draw(st.sampled_from(['float33', 'not_a_dtype', '', 'torch.cuda', 'int', 'int8',
                                                   torch.int32, torch.int64, torch.int8, torch.float16]))
        return fn, kw, E_TYPE, ['logits_dtype'], ()
    x = draw(st.sampled_from(['cu_seq_len_k_start', 'cu_seq_len_k_end', 'weights']))
    kw[x] = draw(NOT_TENSORS)
    return fn, kw, E_TYPE, [x], ()


test_mqa_logits_rejects = reject_cases(MQA_MUTATIONS, bad_mqa_logits)

HC_MUTATIONS = ['a_dtype', 'b_dtype', 'd_dtype', 'sq_dtype', 'd_shape', 'sq_shape', 'num_splits', 'splits_vs_d',
                'sq_noncontig', 'd_stride', 'k', 'a_ndim', 'k_zero', 'n_zero']


@st.composite
def bad_hc_prenorm(draw, what):
    m = draw(dims(2 if what == 'sq_noncontig' else 1, 16))
    n, k = draw(dims(2 if what == 'd_stride' else 1, 24)), draw(dims(1, 200))
    num_splits = draw(st.one_of(st.none(), st.integers(1, 4)))
    g = torch.Generator().manual_seed(draw(seeds))
    a, b = randn(g, m, k, dtype=BF), randn(g, n, k)
    shape = (m,) if num_splits is None else (num_splits, m)
    base, d = sentinel(*shape, n, dtype=F32, pad=1)
    sq_base, sq = sentinel(*shape, dtype=F32)
    fn = dg.tf32_hc_prenorm_gemm
    kw = dict(a=a, b=b, d=d, sqr_sum=sq, num_splits=num_splits)
    keep = (base, sq_base)
    if what == 'a_dtype':
        kw['a'] = other_dtype(draw, a, [F32, torch.float16, E4M3])
        return fn, kw, E_TYPE, ['a'], keep
    if what == 'b_dtype':
        kw['b'] = other_dtype(draw, b, [BF, torch.float16, torch.float64])
        return fn, kw, E_TYPE, ['b'], keep
    if what == 'd_dtype':
        kw['d'] = sentinel(*shape, n, dtype=draw(st.sampled_from([BF, torch.float16, torch.float64])))[1]
        return fn, kw, E_TYPE, ['d'], keep
    if what == 'sq_dtype':
        kw['sqr_sum'] = sentinel(*shape, dtype=draw(st.sampled_from([BF, torch.float16, torch.float64])))[1]
        return fn, kw, E_TYPE, ['sqr_sum'], keep
    if what == 'd_shape':
        kw['d'] = sentinel(*shape, n + 1, dtype=F32)[1]
        return fn, kw, E_VALUE, ['d'], keep
    if what == 'sq_shape':
        kw['sqr_sum'] = sentinel(*shape[:-1], m + 1, dtype=F32)[1]
        return fn, kw, E_VALUE, ['sqr_sum'], keep
    if what == 'num_splits':
        kw['num_splits'] = draw(NONPOS_INTS)
        return fn, kw, E_VALUE, ['num_splits'], keep
    if what == 'splits_vs_d':  # d and sqr_sum shaped for another split count
        kw['num_splits'] = (num_splits or 1) + 1
        return fn, kw, E_VALUE, ['d', 'sqr_sum', 'num_splits'], keep
    if what == 'sq_noncontig':
        kw['sqr_sum'] = strided_last(sq)
        return fn, kw, E_VALUE, ['sqr_sum'], keep
    if what == 'd_stride':
        kw['d'] = strided_last(d)
        return fn, kw, E_VALUE, ['d'], keep
    if what == 'k':
        kw['b'] = randn(g, n, k + draw(st.sampled_from([1, 64])))
        return fn, kw, E_VALUE, ['a', 'b'], keep
    if what == 'a_ndim':
        kw['a'] = spoil_ndim(draw, a)
        return fn, kw, E_VALUE, ['a'], keep
    if what == 'k_zero':  # N > 0 and K > 0 are required
        kw['a'], kw['b'] = a[:, :0], b[:, :0]
        return fn, kw, E_VALUE, ['a', 'b'], keep
    kw['b'], kw['d'] = b[:0], sentinel(*shape, 0, dtype=F32)[1]
    return fn, kw, E_VALUE, ['b', 'd'], keep


test_tf32_hc_prenorm_gemm_rejects = reject_cases(HC_MUTATIONS, bad_hc_prenorm)

EINSUM_MUTATIONS = ['expr', 'expr_type', 'a_dtype', 'b_dtype', 'd_shape', 'c_with_bf16', 'a_ndim', 'contracted']


@st.composite
def bad_einsum(draw, what):
    expr = draw(st.sampled_from(['bmk,bnk->mn', 'bhr,hdr->bhd', 'bhd,hdr->bhr']))
    x, y, p, q = draw(dims(1, 4)), draw(dims(1, 4)), draw(dims(1, 24)), draw(dims(1, 40))
    g = torch.Generator().manual_seed(draw(seeds))
    if expr == 'bmk,bnk->mn':
        a, b, out_shape = randn(g, x, p, q, dtype=BF), randn(g, x, y, q, dtype=BF), (p, y)
    elif expr == 'bhr,hdr->bhd':
        a, b, out_shape = randn(g, x, y, p, dtype=BF), randn(g, y, q, p, dtype=BF), (x, y, q)
    else:
        a, b, out_shape = randn(g, x, y, q, dtype=BF), randn(g, y, q, p, dtype=BF), (x, y, p)
    out_dtype = F32 if expr == 'bmk,bnk->mn' and draw(st.booleans()) and what != 'c_with_bf16' else BF
    base, d = sentinel(*out_shape, dtype=out_dtype)
    kw = dict(expr=expr, a=a, b=b, d=d)
    if what == 'expr':
        kw['expr'] = draw(st.sampled_from(['ij,jk->ik', 'bmk,bnk->nm', 'bhr,hdr->bdh', '', 'bmk,bnk', 'x' * 300]))
        return dg.einsum, kw, E_VALUE, ['expr', '~einsum expression'], base
    if what == 'expr_type':  # CPython's own 's' converter names the argument by position
        kw['expr'] = draw(st.sampled_from([None, 3, b'bmk,bnk->mn']))
        return dg.einsum, kw, E_TYPE, ['expr', '~einsum() argument 1 must be str'], base
    if what in ('a_dtype', 'b_dtype'):
        kw[what[0]] = other_dtype(draw, kw[what[0]], [F32, torch.float16, E4M3])
        return dg.einsum, kw, E_TYPE, [what[0]], base
    if what == 'd_shape':
        kw['d'] = sentinel(*out_shape[:-1], out_shape[-1] + 1, dtype=out_dtype)[1]
        return dg.einsum, kw, E_VALUE, ['d'], base
    if what == 'c_with_bf16':  # BF16 outputs take no c
        kw['c'] = randn(g, *out_shape, dtype=BF)
        return dg.einsum, kw, E_VALUE, ['c'], base
    if what == 'a_ndim':
        kw['a'] = spoil_ndim(draw, a)
        return dg.einsum, kw, E_VALUE, ['a'], base
    # b's contracted dimension one longer than a's
    kw['b'] = torch.cat([b, b[..., :1]], -1) if expr != 'bhd,hdr->bhr' else torch.cat([b, b[:, :1]], 1)
    return dg.einsum, kw, E_VALUE, ['a', 'b'], base


test_einsum_rejects = reject_cases(EINSUM_MUTATIONS, bad_einsum)

CAST_MUTATIONS = ['x_ndim', 'x_dtype', 'gran_k', 'x_not_tensor', 'channel_rows', 'packed']
CASTS = ['per_token_cast_to_fp8', 'per_block_cast_to_fp8', 'per_channel_cast_to_fp8', 'per_token_cast_to_fp4']


@st.composite
def bad_cast(draw, what):
    which = 'per_channel_cast_to_fp8' if what == 'channel_rows' else \
        draw(st.sampled_from(CASTS[0::3] if what == 'packed' else CASTS))
    fn = getattr(utils, which)
    m, k = draw(dims(1, 16)), 2 * draw(dims(1, 100))
    if which == 'per_channel_cast_to_fp8':
        m = 128
    x = randn(torch.Generator().manual_seed(draw(seeds)), m, k)
    kw = dict(x=x, use_ue8m0=draw(st.booleans()))
    if what == 'x_ndim':
        kw['x'] = spoil_ndim(draw, x)
        return fn, kw, E_VALUE, ['x'], ()
    if what == 'x_dtype':
        kw['x'] = other_dtype(draw, x, [torch.int32, torch.float64, torch.int64, E4M3, torch.uint8])
        return fn, kw, E_TYPE, ['x'], ()
    if what == 'gran_k':
        kw['gran_k'] = draw(NONPOS_INTS)
        return fn, kw, E_VALUE, ['gran_k'], ()
    if what == 'channel_rows':  # rows not a multiple of gran_k
        kw['x'] = x[:draw(st.integers(1, 127))]
        return fn, kw, E_VALUE, ['x', 'gran_k'], ()
    if what == 'packed':  # needs use_ue8m0
        kw['use_packed_ue8m0'] = True
        kw['use_ue8m0'] = False
        return fn, kw, E_VALUE, ['use_packed_ue8m0'], ()
    kw['x'] = draw(NOT_TENSORS)
    return fn, kw, E_TYPE, ['x'], ()


test_casts_reject = reject_cases(CAST_MUTATIONS, bad_cast)

SF_LAYOUT_MUTATIONS = ['sf_dtype', 'sf_ndim', 'not_power', 'not_tensor', 't_recipe_len', 't_recipe_nonpos', 't_mn',
                       't_k', 't_mn_negative', 't_k_negative', 't_num_groups', 't_num_groups_mismatch', 't_unknown',
                       't_sf_dtype']


@st.composite
def bad_sf_layout(draw, what):
    sf = draw(sf_tensors(powers_of_two=True))
    mn, sk = sf.shape[-2], sf.shape[-1]
    ng = sf.shape[0] if sf.dim() == 3 else None
    kw = dict(sf=sf)
    if what.startswith('t_'):
        fn = dg.transform_sf_into_required_layout
        kw.update(mn=mn, k=sk * 128, recipe=(1, 128, 128), num_groups=ng, is_sfa=True)
        if what == 't_recipe_len':
            kw['recipe'] = tuple(draw(st.lists(st.integers(1, 128), max_size=5).filter(lambda r: len(r) not in (2, 3))))
            return fn, kw, E_TYPE, ['recipe'], ()
        if what == 't_recipe_nonpos':  # the entries used for an sfa: gran_m and gran_k (gran_n is unused)
            r = [1, 128, 128]
            r[draw(st.sampled_from([0, 2]))] = draw(NONPOS_INTS)
            kw['recipe'] = tuple(r)
            return fn, kw, E_VALUE, ['recipe'], ()
        if what == 't_mn':
            kw['mn'] = mn + draw(st.integers(1, 300))
            return fn, kw, E_VALUE, ['sf', 'mn'], ()
        if what == 't_k':
            kw['k'] = sk * 128 + draw(st.sampled_from([1, 128, 1000]))
            return fn, kw, E_VALUE, ['sf', 'k'], ()
        if what == 't_mn_negative':
            kw['mn'] = draw(st.integers(-(2 ** 62), -1))
            return fn, kw, E_VALUE, ['mn', 'sf'], ()
        if what == 't_k_negative':
            kw['k'] = draw(st.integers(-(2 ** 62), -1))
            return fn, kw, E_VALUE, ['k', 'sf'], ()
        if what == 't_num_groups':
            kw['num_groups'] = draw(NONPOS_INTS)
            return fn, kw, E_VALUE, ['num_groups'], ()
        if what == 't_num_groups_mismatch':
            kw['num_groups'] = (ng or 1) + 1
            return fn, kw, E_VALUE, ['num_groups', 'sf'], ()
        if what == 't_unknown':  # gran_k 64 has no SF transformation
            kw['recipe'], kw['k'] = (1, 128, 64), sk * 64
            return fn, kw, E_VALUE, ['recipe', 'sf'], ()
        kw['sf'] = other_dtype(draw, sf, [BF, torch.float16, torch.float64])
        return fn, kw, E_TYPE, ['sf'], ()
    which = 'get_mn_major_tma_aligned_packed_ue8m0_tensor' if what == 'not_power' else \
        draw(st.sampled_from(['get_mn_major_tma_aligned_tensor', 'get_mn_major_tma_aligned_packed_ue8m0_tensor']))
    fn = getattr(dg, which)
    if what == 'sf_dtype':
        kw['sf'] = other_dtype(draw, sf, [BF, torch.float16, torch.float64] +
                               ([torch.int32] if which == 'get_mn_major_tma_aligned_tensor' else []))
        return fn, kw, E_TYPE, ['sf'], ()
    if what == 'sf_ndim':
        sf4 = sf[(None,) * (4 - sf.dim())]
        kw['sf'] = sf.flatten() if draw(st.booleans()) else sf4.expand(2, *sf4.shape[1:])
        return fn, kw, E_VALUE, ['sf'], ()
    if what == 'not_power':  # packed UE8M0 takes powers of two (or zero) only
        bad = sf.clone()
        bad[tuple(draw(st.integers(0, size - 1)) for size in bad.shape)] *= draw(st.sampled_from([1.5, -1.0, 3.0]))
        kw['sf'] = bad
        return fn, kw, E_VALUE, ['sf'], ()
    kw['sf'] = draw(NOT_TENSORS)
    return fn, kw, E_TYPE, ['sf'], ()


test_sf_layouts_reject = reject_cases(SF_LAYOUT_MUTATIONS, bad_sf_layout)


@examples(20)
@given(x=st.integers(-(2 ** 31), 2 ** 31 - 1), elem=st.integers(-(2 ** 31), 2 ** 31 - 1))
def test_get_tma_aligned_size_rejects(x, elem):
    if x >= 0 and elem in (1, 2, 4, 8, 16):
        assert dg.get_tma_aligned_size(x, elem) == align(x, 16 // elem)
        return
    with pytest.raises(ValueError, match="get_tma_aligned_size: argument '(x|element_size)'"):
        dg.get_tma_aligned_size(x, elem)


def test_snapshot_sees_any_write():
    """The harness itself: a one-byte change anywhere in a view's storage (padding too) shows."""
    base, d = sentinel(3, 4, pad=2)
    snap = Snapshot(d)
    base.view(torch.uint8)[2, 9] ^= 1
    with pytest.raises(AssertionError):
        snap.assert_unchanged()


# ---- same bits: thread counts, pre-packed weights, NumPy -----------------------------------------

def raw_bits(t):
    return t.contiguous().view(torch.uint8)


@examples(25)
@given(kind=st.sampled_from(['bf16', 'fp8', 'masked', 'mqa', 'hc']), m=dims(1, 70), n=dims(1, 200),
       k=dims(1, 300), seed=seeds)
def test_same_bits_for_any_thread_count(kind, m, n, k, seed):
    """README: the same inputs give the same bits for any thread count (1 vs the default)."""
    g = torch.Generator().manual_seed(seed)
    if kind in ('bf16', 'fp8'):
        if kind == 'bf16':
            a, b = randn(g, m, k, dtype=BF), randn(g, n, k, dtype=BF)
            fn = dg.bf16_gemm_nt
        else:
            a, b, _, _ = fp8_operands(g, m, n, k, False)
            fn = dg.fp8_gemm_nt

        def run():
            d = torch.empty(m, n, dtype=F32)
            fn(a, b, d)
            return [d]
    elif kind == 'masked':
        groups = 1 + m % 3
        a, b = randn(g, groups, m, k, dtype=BF), randn(g, groups, n, k, dtype=BF)
        mm = torch.randint(0, m + 1, (groups,), generator=g, dtype=torch.int32)

        def run():
            _, d = sentinel(groups, m, n)
            dg.m_grouped_bf16_gemm_nt_masked(a, b, d, mm, 16)
            return [d]
    elif kind == 'mqa':
        s, h = 1 + m % 9, 1 + n % 8
        q, kv = randn(g, s, h, k).to(E4M3), randn(g, n, k).to(E4M3)
        sf, w = torch.rand(n, generator=g) + 0.5, randn(g, s, h)
        ks = torch.randint(0, n + 1, (s,), generator=g, dtype=torch.int32)
        ke = torch.minimum(ks + torch.randint(0, n + 1, (s,), generator=g, dtype=torch.int32),
                           torch.tensor(n, dtype=torch.int32))

        def run():
            return [dg.fp8_mqa_logits(q, (kv, sf), w, ks, ke)]
    else:
        a, b = randn(g, m, k, dtype=BF), randn(g, n % 40 + 1, k)

        def run():
            d, sq = torch.empty(2, m, b.size(0)), torch.empty(2, m)
            dg.tf32_hc_prenorm_gemm(a, b, d, sq, num_splits=2)
            return [d, sq]
    many = run()
    with threads(1):
        one = run()
    for x, y in zip(many, one):
        assert torch.equal(raw_bits(x), raw_bits(y)), f'{kind}: bits differ between thread counts'


@examples(20)
@given(fp8=st.booleans(), m=dims(1, 40), n=dims(1, 200), k=dims(1, 300), out_dtype=st.sampled_from([BF, F32]),
       seed=seeds)
def test_packed_b_gives_the_unpacked_bits(fp8, m, n, k, out_dtype, seed):
    """pack_b(b) in place of b: bitwise the unpacked call's D (README, deepgemm.h)."""
    g = torch.Generator().manual_seed(seed)
    if fp8:
        a, b, _, _ = fp8_operands(g, m, n, k, False)
        fn = dg.fp8_gemm_nt
    else:
        a, b = randn(g, m, k, dtype=BF), randn(g, n, k, dtype=BF)
        fn = dg.bf16_gemm_nt
    packed = dg.pack_b(b)
    want, got = torch.empty(m, n, dtype=out_dtype), torch.empty(m, n, dtype=out_dtype)
    fn(a, b, want)
    fn(a, packed, got)
    assert torch.equal(raw_bits(got), raw_bits(want))


@examples(15)
@given(m=dims(1, 40), n=dims(1, 60), k=dims(1, 200), seed=seeds)
def test_numpy_gives_the_torch_bits(m, n, k, seed):
    """NumPy arrays (ml_dtypes) in place of torch tensors: the same bits, outputs as NumPy."""
    np = pytest.importorskip('numpy')
    ml = pytest.importorskip('ml_dtypes')
    g = torch.Generator().manual_seed(seed)
    x, w = randn(g, m, k), randn(g, n, k)
    a, b = x.to(BF), w.to(BF)
    d = torch.empty(m, n)
    dg.bf16_gemm_nt(a, b, d)
    an, bn = x.numpy().astype(ml.bfloat16), w.numpy().astype(ml.bfloat16)
    dn = np.empty((m, n), dtype=np.float32)
    dg.bf16_gemm_nt(an, bn, dn)
    assert np.array_equal(dn.view(np.uint32), d.numpy().view(np.uint32))
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0=False)
    qn, sfn = utils.per_token_cast_to_fp8(x.numpy(), use_ue8m0=False)
    assert isinstance(qn, np.ndarray) and np.array_equal(qn.view(np.uint8), q.view(torch.uint8).numpy())
    assert np.array_equal(sfn.view(np.uint32), sf.numpy().view(np.uint32))


# ---- integer arguments and logits_dtype (issue 17: bugs these properties found, fixed) ------------
#
# Scalar integer arguments were converted by CPython itself (PyArg_ParseTupleAndKeywords 'i' /
# 'L' formats, PyLong_AsLong in python/src/convert.c:dgp_int) and raised CPython's own
# exceptions: OverflowError 'signed integer is greater than maximum' / 'Python int too large to
# convert to C long', or TypeError "'float' object cannot be interpreted as an integer", naming
# neither the function nor the argument (and OverflowError is none of the exceptions the README
# promises). Every integer argument now goes through dgp_int / dgp_int64: TypeError "<fn>:
# argument '<arg>' must be an int, got float", ValueError "<fn>: argument '<arg>' = <value> does
# not fit in a 32-bit int" (64-bit). Nothing is written in any of these cases (checked).

def _masked_call(expected_m):
    a, b = torch.randn(2, 8, 16, dtype=BF), torch.randn(2, 4, 16, dtype=BF)
    return dg.m_grouped_bf16_gemm_nt_masked, dict(a=a, b=b, d=sentinel(2, 8, 4)[1],
                                                  masked_m=torch.tensor([3, 8], dtype=torch.int32),
                                                  expected_m=expected_m)


def _mqa_call(max_seqlen_k):
    q, kv = torch.randn(3, 2, 16).to(E4M3), torch.randn(7, 16).to(E4M3)
    return dg.fp8_mqa_logits, dict(q=q, kv=(kv, torch.rand(7) + 0.5), weights=torch.randn(3, 2),
                                   cu_seq_len_k_start=torch.tensor([0, 2, 7], dtype=torch.int32),
                                   cu_seq_len_k_end=torch.tensor([3, 2, 7], dtype=torch.int32),
                                   max_seqlen_k=max_seqlen_k)


def _cast_call(gran_k):
    return utils.per_token_cast_to_fp8, dict(x=torch.randn(4, 128), use_ue8m0=False, gran_k=gran_k)


def _block_cast_call(gran_k):
    return utils.per_block_cast_to_fp8, dict(x=torch.randn(4, 128), use_ue8m0=False, gran_k=gran_k)


def _cast_back_call(gran_k):
    q, sf = utils.per_token_cast_to_fp4(torch.randn(4, 64), use_ue8m0=True, gran_k=32)
    return utils.cast_back_from_fp4, dict(packed=q, sf=sf, gran_k=gran_k)


def _metadata_call(block_kv):
    return dg.get_paged_mqa_logits_metadata, dict(context_lens=torch.tensor([5, 9], dtype=torch.int32),
                                                  block_kv=block_kv, num_sms=2)


def _metadata_sms_call(num_sms):
    return dg.get_paged_mqa_logits_metadata, dict(context_lens=torch.tensor([5, 9], dtype=torch.int32),
                                                  block_kv=64, num_sms=num_sms)


def _fp8_recipe_call(entry):
    a = utils.per_token_cast_to_fp8(torch.randn(4, 128), use_ue8m0=False)
    b = utils.per_block_cast_to_fp8(torch.randn(8, 128), use_ue8m0=False)
    return dg.fp8_gemm_nt, dict(a=a, b=b, d=sentinel(4, 8)[1], recipe=(1, entry, 128))


def _skip_head_mid_call(mid):
    a = utils.per_token_cast_to_fp8(torch.randn(4, 128), use_ue8m0=False)
    b = utils.per_block_cast_to_fp8(torch.randn(8, 128), use_ue8m0=False)
    return dg.fp8_gemm_nt_skip_head_mid, dict(a=a, b=b, d=sentinel(4, 16)[1], head_splits=(4, mid, 4))


def _hc_call(num_splits):
    return dg.tf32_hc_prenorm_gemm, dict(a=torch.randn(4, 64, dtype=BF), b=torch.randn(5, 64),
                                         d=sentinel(4, 5, dtype=F32)[1], sqr_sum=sentinel(4, dtype=F32)[1],
                                         num_splits=num_splits)


def _psum_call(expected):
    a, b = torch.randn(8, 16, dtype=BF), torch.randn(2, 4, 16, dtype=BF)
    return dg.m_grouped_bf16_gemm_nt_contiguous, dict(a=a, b=b, d=sentinel(8, 4)[1],
                                                      grouped_layout=torch.tensor([4, 8], dtype=torch.int32),
                                                      use_psum_layout=True, expected_m_for_psum_layout=expected)


def _ks_call(k1):
    a, b = torch.randn(8, 4, dtype=BF), torch.randn(8, 6, dtype=BF)
    return dg.k_grouped_bf16_gemm_tn_contiguous, dict(a=a, b=b, d=sentinel(2, 4, 6, dtype=F32)[1], ks_cpu=[4, k1],
                                                      grouped_layout=torch.tensor([4, 8], dtype=torch.int32))


def _transform_call(mn):
    return dg.transform_sf_into_required_layout, dict(sf=torch.ones(4, 1), mn=mn, k=128, recipe=(1, 128, 128),
                                                      is_sfa=True)


def _transform_k_call(k):
    return dg.transform_sf_into_required_layout, dict(sf=torch.ones(4, 1), mn=4, k=k, recipe=(1, 128, 128),
                                                      is_sfa=True)


def _transform_groups_call(groups):
    return dg.transform_sf_into_required_layout, dict(sf=torch.ones(4, 1), mn=4, k=128, recipe=(1, 128, 128),
                                                      is_sfa=True, num_groups=groups)


def _tma_size_call(x):
    return dg.get_tma_aligned_size, dict(x=x, element_size=4)


def _set_num_sms_call(n):
    return dg.set_num_sms, dict(new_num_sms=n)


INT_ARGUMENTS = [
    # (call builder, argument, value): formerly an 'i' format, past a C int
    pytest.param(_masked_call, 'expected_m', 2 ** 31, id='expected_m=2^31'),
    pytest.param(_mqa_call, 'max_seqlen_k', 2 ** 31, id='max_seqlen_k=2^31'),
    pytest.param(_cast_call, 'gran_k', 2 ** 31, id='gran_k=2^31'),
    pytest.param(_block_cast_call, 'gran_k', -(2 ** 31) - 1, id='block gran_k=-2^31-1'),
    pytest.param(_cast_back_call, 'gran_k', 2 ** 40, id='cast_back gran_k=2^40'),
    pytest.param(_metadata_call, 'block_kv', 2 ** 31, id='block_kv=2^31'),
    pytest.param(_metadata_sms_call, 'num_sms', 2 ** 70, id='num_sms=2^70'),
    pytest.param(_tma_size_call, 'x', 2 ** 64, id='tma x=2^64'),
    pytest.param(_set_num_sms_call, 'new_num_sms', 2 ** 31, id='set_num_sms=2^31'),
    # formerly an 'i' format, not an int
    pytest.param(_masked_call, 'expected_m', 1.5, id='expected_m=1.5'),
    pytest.param(_mqa_call, 'max_seqlen_k', None, id='max_seqlen_k=None'),
    pytest.param(_cast_call, 'gran_k', '128', id="gran_k='128'"),
    pytest.param(_cast_back_call, 'gran_k', 32.0, id='cast_back gran_k=32.0'),
    pytest.param(_metadata_call, 'block_kv', 64.0, id='block_kv=64.0'),
    pytest.param(_tma_size_call, 'x', 1.5, id='tma x=1.5'),
    pytest.param(_set_num_sms_call, 'new_num_sms', 2.0, id='set_num_sms=2.0'),
    pytest.param(_masked_call, 'expected_m', torch.tensor(2.0), id='expected_m=float tensor'),
    # formerly dgp_int (PyLong_AsLong), past a C long
    pytest.param(_masked_call, 'expected_m', 2 ** 64, id='expected_m=2^64'),
    pytest.param(_fp8_recipe_call, 'recipe', 2 ** 63, id='recipe=(1,2^63,128)'),
    pytest.param(_fp8_recipe_call, 'recipe', -(2 ** 64), id='recipe=(1,-2^64,128)'),
    pytest.param(_skip_head_mid_call, 'head_splits', 2 ** 63, id='head_splits=(4,2^63,4)'),
    pytest.param(_hc_call, 'num_splits', 2 ** 64, id='num_splits=2^64'),
    pytest.param(_psum_call, 'expected_m_for_psum_layout', 2 ** 63, id='expected_m_for_psum_layout=2^63'),
    pytest.param(_ks_call, 'ks_cpu', 2 ** 63, id='ks_cpu=[4,2^63]'),
    pytest.param(_ks_call, 'ks_cpu', 4.0, id='ks_cpu=[4,4.0]'),
    pytest.param(_transform_groups_call, 'num_groups', 2 ** 64, id='num_groups=2^64'),
    # formerly an 'L' format, past a long long / not an int
    pytest.param(_transform_call, 'mn', 2 ** 64, id='mn=2^64'),
    pytest.param(_transform_call, 'mn', 4.0, id='mn=4.0'),
    pytest.param(_transform_k_call, 'k', -(2 ** 63) - 1, id='k=-2^63-1'),
]


@pytest.mark.parametrize('build,arg,value', INT_ARGUMENTS)
def test_int_arguments_name_themselves(build, arg, value):
    """TypeError (not an int) / ValueError (out of range) naming function and argument; nothing written."""
    fn, kw = build(value)
    exc = E_VALUE if isinstance(value, int) else E_TYPE
    expect_rejected(fn, kw, exc, [arg])


@pytest.mark.parametrize('value', [2 ** 31, 2 ** 63, -(2 ** 63) - 1, 10 ** 5000],
                         ids=['2^31', '2^63', '-2^63-1', '10^5000'])
def test_int_argument_overflow_message(value):
    """The value is quoted (an int too long to print, past Python's digit limit, is said so)."""
    fn, kw = _masked_call(value)
    with pytest.raises(ValueError, match="m_grouped_bf16_gemm_nt_masked: argument 'expected_m'") as info:
        fn(**kw)
    assert 'does not fit in a 32-bit int' in str(info.value)
    if value != 10 ** 5000:
        assert f'= {value} ' in str(info.value)


def test_int_arguments_accept_index():
    """What CPython's parsing accepted still is: bools, NumPy integers, one-element integer tensors."""
    np = pytest.importorskip('numpy')
    assert dg.get_tma_aligned_size(np.int64(5), torch.tensor(4)) == dg.get_tma_aligned_size(5, 4)
    assert dg.get_tma_aligned_size(True, 1) == 16
    fn, kw = _masked_call(np.int32(8))
    fn(**kw)
    fn, kw = _transform_call(np.int64(4))
    assert torch.equal(fn(**kw), dg.transform_sf_into_required_layout(**_transform_call(4)[1]))


@pytest.mark.parametrize('logits_dtype', [torch.int32, 'int', torch.int8, torch.float16])
@pytest.mark.parametrize('paged', [False, True])
def test_logits_dtype_named(logits_dtype, paged):
    """fp8_fp4_mqa_logits(logits_dtype=torch.int32) named 'logits' (the C output), not 'logits_dtype'."""
    if paged:
        q = torch.randn(2, 1, 2, 32).to(E4M3)
        kv = torch.zeros(2, 64, 1, 36, dtype=torch.uint8)
        lens = torch.tensor([5, 9], dtype=torch.int32)
        kw = dict(q=(q, None), kv_cache=kv, weights=torch.randn(2, 2), context_lens=lens,
                  block_table=torch.tensor([[0], [1]], dtype=torch.int32),
                  schedule_meta=dg.get_paged_mqa_logits_metadata(lens, 64, dg.get_num_sms()), max_context_len=64)
        fn = dg.fp8_fp4_paged_mqa_logits
    else:
        fn, kw = _mqa_call(0)
        kw.pop('max_seqlen_k')
        kw['q'] = (kw['q'], None)
        fn = dg.fp8_fp4_mqa_logits
    expect_rejected(fn, dict(kw, logits_dtype=logits_dtype), E_TYPE, ['logits_dtype'])

"""Pre-packed weights (pack_b -> PackedB): every `_nt` GEMM that takes one in place of b gives
bitwise the D of the unpacked call, on odd shapes (M = 1, 2, 17; N and K tails); errors name the
argument and write nothing; free() and `with` end the object's life."""
import os
import re
import threading

import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp4

MS = [1, 2, 17]


def bits(t):
    """The raw bits of d, so that equality is bitwise (and -0.0 != 0.0)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def same_bits(x, y):
    return torch.equal(bits(x), bits(y))


def randn(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def stack_pairs(pairs):
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


# ---- dense ---------------------------------------------------------------------------------------

@pytest.mark.parametrize('n,k', [(77, 200), (130, 67), (16, 128)])
@pytest.mark.parametrize('out_dtype', [torch.bfloat16, torch.float32])
def test_bf16_packed_is_bitwise_the_unpacked_call(n, k, out_dtype):
    b = randn(n, k)
    packed = dg.pack_b(b)
    b_mn_major = b.t().contiguous().t()  # any strides are packed
    packed_mn = dg.pack_b(b_mn_major)
    for m in MS:
        a = randn(m, k)
        ref, d, d_mn = (torch.empty(m, n, dtype=out_dtype) for _ in range(3))
        dg.bf16_gemm_nt(a, b, ref)
        dg.bf16_gemm_nt(a, packed, d)
        dg.bf16_gemm_nt(a, packed_mn, d_mn)
        assert same_bits(d, ref) and same_bits(d_mn, ref), m
    if out_dtype == torch.float32:  # c, accumulating in place as DeepGEMM does
        a, c = randn(5, k), torch.randn(5, n)
        ref, d = c.clone(), c.clone()
        dg.bf16_gemm_nt(a, b, ref, c=ref)
        dg.bf16_gemm_nt(a, packed, d, c=d)
        assert same_bits(d, ref)


def test_packing_copies_b():
    b = randn(40, 96)
    packed = dg.pack_b(b)
    a = randn(3, 96)
    ref, d = torch.empty(3, 40), torch.empty(3, 40)
    dg.bf16_gemm_nt(a, b, ref)
    b.zero_()  # the packed object does not refer to b
    dg.bf16_gemm_nt(a, packed, d)
    assert same_bits(d, ref)


FP8_CASES = {
    # 1D2D: per-token A, 128x128-block B, float32 scales; the default recipe (1, 128, 128)
    'fp8_1d2d': dict(k=200, cast_b=lambda b: per_block_cast_to_fp8(b, use_ue8m0=False), kw={}),
    # the same with power-of-two (UE8M0) float32 scales, recipe given explicitly
    'fp8_1d2d_ue8m0': dict(k=300, cast_b=lambda b: per_block_cast_to_fp8(b, use_ue8m0=True),
                           kw=dict(recipe=(1, 128, 128)), ue8m0=True),
    # per-row B with packed UE8M0 (int32) scales: the default recipe (1, 1, 128)
    'fp8_packed_ue8m0': dict(k=464, cast_b=lambda b: per_token_cast_to_fp8(b, use_ue8m0=True,
                                                                           use_packed_ue8m0=True),
                             kw={}, ue8m0=True, packed_sf=True),
}


def cast_a(a, case):
    return per_token_cast_to_fp8(a, use_ue8m0=case.get('ue8m0', False),
                                 use_packed_ue8m0=case.get('packed_sf', False))


@pytest.mark.parametrize('name', list(FP8_CASES))
def test_fp8_packed_is_bitwise_the_unpacked_call(name):
    case = FP8_CASES[name]
    n, k = 75, case['k']
    qb = case['cast_b'](randn(n, k))
    packed = dg.pack_b(qb, **case['kw'])
    assert packed.kind == 'fp8' and packed.shape == (n, k)
    assert packed.sf_dtype == ('int32' if case.get('packed_sf') else 'float32')
    assert packed.recipe_b == ((1, 128) if case.get('packed_sf') else (128, 128))
    for m in MS:
        qa = cast_a(randn(m, k), case)
        ref, d = torch.empty(m, n, dtype=torch.bfloat16), torch.empty(m, n, dtype=torch.bfloat16)
        dg.fp8_gemm_nt(qa, qb, ref, **case['kw'])
        dg.fp8_gemm_nt(qa, packed, d, **case['kw'])
        assert same_bits(d, ref), m
    c = torch.randn(4, n)
    qa = cast_a(randn(4, k), case)
    ref, d = c.clone(), c.clone()
    dg.fp8_fp4_gemm_nt(qa, qb, ref, c=ref, **case['kw'])
    dg.fp8_fp4_gemm_nt(qa, packed, d, c=d, **case['kw'])
    assert same_bits(d, ref)


@pytest.mark.parametrize('fp4_a', [False, True])
@pytest.mark.parametrize('gran_k', [32, 128])
def test_fp8_fp4_packed_is_bitwise_the_unpacked_call(fp4_a, gran_k):
    n, k = 70, 500  # a K tail; ceil(K / gran_k) a multiple of 4 for A's packed UE8M0 scales
    recipe = dict(recipe_a=(1, gran_k), recipe_b=(1, gran_k))
    qb = per_token_cast_to_fp4(randn(n, k), use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
    packed = dg.pack_b(qb, **recipe)
    assert packed.kind == 'fp4' and packed.shape == (n, k) and packed.recipe_b == (1, gran_k)
    for m in MS:
        a = randn(m, k)
        qa = (per_token_cast_to_fp4 if fp4_a else per_token_cast_to_fp8)(
            a, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
        ref, d = torch.empty(m, n, dtype=torch.bfloat16), torch.empty(m, n, dtype=torch.bfloat16)
        dg.fp8_fp4_gemm_nt(qa, qb, ref, **recipe)
        dg.fp8_fp4_gemm_nt(qa, packed, d, **recipe)
        assert same_bits(d, ref), m


# ---- m-grouped -----------------------------------------------------------------------------------

def grouped_bf16(g, n, k):
    return randn(g, n, k)


def grouped_fp8(g, n, k):
    return stack_pairs([per_block_cast_to_fp8(randn(n, k), use_ue8m0=False) for _ in range(g)])


def grouped_fp4(g, n, k):
    return stack_pairs([per_token_cast_to_fp4(randn(n, k), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
                        for _ in range(g)])


GROUPED = {  # weights, A's cast, recipe keywords, the masked and contiguous GEMMs
    'bf16': (grouped_bf16, None, {}, dg.m_grouped_bf16_gemm_nt_masked, dg.m_grouped_bf16_gemm_nt_contiguous),
    'fp8': (grouped_fp8, lambda a: per_token_cast_to_fp8(a, use_ue8m0=False), {},
            dg.m_grouped_fp8_gemm_nt_masked, dg.m_grouped_fp8_gemm_nt_contiguous),
    'fp8_fp4': (grouped_fp4, lambda a: per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True),
                dict(recipe_a=(1, 32), recipe_b=(1, 32)),
                dg.m_grouped_fp8_fp4_gemm_nt_masked, dg.m_grouped_fp8_fp4_gemm_nt_contiguous),
}


@pytest.mark.parametrize('name', list(GROUPED))
def test_grouped_masked_packed_is_bitwise_the_unpacked_call(name):
    make_b, cast, kw, masked, _ = GROUPED[name]
    g, max_m, n, k = 4, 17, 66, 250
    b = make_b(g, n, k)
    packed = dg.pack_b(b, **kw)
    assert packed.groups == g and packed.shape == (g, n, k)
    a = randn(g, max_m, k)
    if cast:
        a = stack_pairs([cast(a[i]) for i in range(g)])
    masked_m = torch.tensor([1, 0, 17, 2], dtype=torch.int32)
    ref = torch.full((g, max_m, n), 3.0, dtype=torch.bfloat16)
    d = ref.clone()
    masked(a, b, ref, masked_m, 8, **kw)
    masked(a, packed, d, masked_m, 8, **kw)
    assert same_bits(d, ref)  # rows past masked_m[g] stay 3.0 in both


@pytest.mark.parametrize('psum', [False, True])
@pytest.mark.parametrize('name', list(GROUPED))
def test_grouped_contiguous_packed_is_bitwise_the_unpacked_call(name, psum):
    make_b, cast, kw, _, contiguous = GROUPED[name]
    g, n, k = 3, 40, 250
    al = dg.get_mk_alignment_for_contiguous_layout()
    rows = [17, 0, 2]  # psum form: group g starts at align(end[g - 1])
    m = al * 2 + rows[-1]
    if psum:
        layout = torch.tensor([rows[0], al + rows[1], 2 * al + rows[2]], dtype=torch.int32)
    else:
        layout = torch.full((m,), -1, dtype=torch.int32)
        layout[:17], layout[al:al + 1], layout[2 * al:] = 2, 0, 1
    b = make_b(g, n, k)
    packed = dg.pack_b(b, **kw)
    a = randn(m, k)
    if cast:
        a = cast(a)
    ref = torch.full((m, n), 3.0, dtype=torch.bfloat16)
    d = ref.clone()
    contiguous(a, b, ref, layout, use_psum_layout=psum, **kw)
    contiguous(a, packed, d, layout, use_psum_layout=psum, **kw)
    assert same_bits(d, ref)


# ---- the object --------------------------------------------------------------------------------

def test_attributes_and_repr():
    p = dg.pack_b(randn(33, 70))
    assert (p.n, p.k, p.groups, p.kind, p.sf_dtype, p.recipe_b) == (33, 70, 0, 'bf16', None, None)
    assert p.isa == dg.get_isa() and not p.freed
    assert re.fullmatch(r'<deep_gemm_cpu\.PackedB bf16 \[33, 70\] isa=\w+>', repr(p))
    q = dg.pack_b(grouped_fp4(2, 8, 64), recipe_a=(1, 32), recipe_b=(1, 32))
    assert q.shape == (2, 8, 64) and q.k == 64
    assert 'fp4 [2, 8, 64] recipe_b=(1, 32) sf=ue8m0 (int32)' in repr(q)
    with pytest.raises(AttributeError):
        p.n = 3
    assert isinstance(p, dg.PackedB) and isinstance(dg.PackedB(randn(4, 8)), dg.PackedB)
    # recipe_b alone fixes B's granularity (recipe_a is not needed to pack)
    assert dg.pack_b(per_token_cast_to_fp4(randn(8, 64), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True),
                     recipe_b=(1, 32)).recipe_b == (1, 32)


def test_free_and_context_manager():
    b, a = randn(16, 64), randn(2, 64)
    d = torch.full((2, 16), 3.0, dtype=torch.bfloat16)
    p = dg.pack_b(b)
    p.free()
    p.free()  # twice is fine
    assert p.freed and 'freed' in repr(p)
    with pytest.raises(ValueError, match=r"bf16_gemm_nt: argument 'b' \(PackedB\) was freed"):
        dg.bf16_gemm_nt(a, p, d)
    with dg.pack_b(b) as q:
        dg.bf16_gemm_nt(a, q, d)
    assert q.freed
    with pytest.raises(ValueError, match='was freed'):
        dg.bf16_gemm_nt(a, q, d)
    g = dg.pack_b(randn(2, 16, 64))
    g.free()
    with pytest.raises(ValueError, match="m_grouped_bf16_gemm_nt_masked: argument 'b'.*freed"):
        dg.m_grouped_bf16_gemm_nt_masked(randn(2, 4, 64), g, torch.empty(2, 4, 16), torch.tensor([1, 1],
                                         dtype=torch.int32), 1)


def test_free_while_other_threads_compute():
    """free() during calls running without the GIL: they finish on live memory, later ones raise."""
    b, a = randn(256, 512), randn(64, 512)
    p = dg.pack_b(b)
    ref = torch.empty(64, 256)
    dg.bf16_gemm_nt(a, b, ref)
    results = []

    def work():
        d = torch.empty(64, 256)
        for _ in range(20):
            try:
                dg.bf16_gemm_nt(a, p, d)
            except ValueError:
                results.append('freed')
                return
            results.append(same_bits(d, ref))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    p.free()
    for t in threads:
        t.join()
    assert all(r is True or r == 'freed' for r in results) and p.freed


# ---- errors: the argument named, nothing written -----------------------------------------------

def test_pack_b_bad_inputs():
    with pytest.raises(TypeError, match="pack_b: argument 'b' must be a torch.Tensor"):
        dg.pack_b(3)
    q, sf = per_block_cast_to_fp8(randn(16, 128), use_ue8m0=False)
    with pytest.raises(TypeError, match="pack_b: argument 'b' is a float8_e4m3fn tensor without scales"):
        dg.pack_b(q)
    with pytest.raises(TypeError, match="pack_b: argument 'b' pairs bfloat16 data with scales"):
        dg.pack_b((randn(16, 128), sf))
    with pytest.raises(TypeError, match=r"pack_b: argument 'b\[1\]' is required"):
        dg.pack_b((q, None))
    with pytest.raises(ValueError, match="pack_b: arguments 'recipe'.*bfloat16"):
        dg.pack_b(randn(16, 128), recipe=(1, 128, 128))
    with pytest.raises(ValueError, match=r"pack_b: argument 'b' must be \[N, K\].*got 1 dimensions"):
        dg.pack_b(randn(128))
    with pytest.raises(ValueError, match=r"'sfb'|'b\[1\]'"):
        dg.pack_b((q, sf[:, :0]))  # scales that do not cover b
    with pytest.raises(TypeError, match="'recipe'"):
        dg.pack_b((q, sf), recipe=(1, 128))
    with pytest.raises(TypeError):
        dg.pack_b(randn(16, 128), bogus=1)


def test_packed_in_the_wrong_call():
    a, b = randn(4, 128), randn(16, 128)
    qa, qb = per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)
    pb, pq, pg = dg.pack_b(b), dg.pack_b(qb), dg.pack_b(randn(2, 16, 128))
    d = torch.full((4, 16), 3.0, dtype=torch.bfloat16)
    d3 = torch.full((2, 4, 16), 3.0, dtype=torch.bfloat16)
    mm = torch.tensor([4, 1], dtype=torch.int32)
    with pytest.raises(TypeError, match="bf16_gemm_nt: argument 'b' holds fp8 weights; pass it to fp8_fp4_gemm_nt"):
        dg.bf16_gemm_nt(a, pq, d)
    with pytest.raises(TypeError, match="fp8_fp4_gemm_nt: argument 'b' holds bf16 weights; pass it to bf16_gemm_nt"):
        dg.fp8_gemm_nt(qa, pb, d)
    with pytest.raises(ValueError, match="bf16_gemm_nt: argument 'b' holds 2 groups"):
        dg.bf16_gemm_nt(a, pg, d)
    with pytest.raises(ValueError, match=r"m_grouped_bf16_gemm_nt_masked: argument 'b' holds dense weights"):
        dg.m_grouped_bf16_gemm_nt_masked(a.expand(2, 4, 128), pb, d3, mm, 2)
    with pytest.raises(TypeError, match="m_grouped_fp8_fp4_gemm_nt_masked: argument 'b' holds bf16"):
        dg.m_grouped_fp8_gemm_nt_masked(stack_pairs([qa, qa]), pg, d3, mm, 2)
    only_nt = "argument 'b' is a PackedB, which this function does not take; only the `_nt` GEMMs"
    with pytest.raises(TypeError, match='bf16_gemm_nn: ' + only_nt):
        dg.bf16_gemm_nn(a, pb, d)
    with pytest.raises(TypeError, match='fp8_fp4_gemm_tn: ' + only_nt):
        dg.fp8_gemm_tn(qa, pq, d)
    with pytest.raises(TypeError, match='m_grouped_bf16_gemm_nn_contiguous: ' + only_nt):
        dg.m_grouped_bf16_gemm_nn_contiguous(a, pg, d, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match='fp8_gemm_nt_skip_head_mid: ' + only_nt):
        dg.fp8_gemm_nt_skip_head_mid(qa, pq, d, (8, 0, 8))
    with pytest.raises(TypeError, match="bf16_gemm_nt: argument 'a' is a PackedB"):
        dg.bf16_gemm_nt(pb, pb, d)
    assert (d == 3.0).all() and (d3 == 3.0).all()


def test_packed_call_argument_errors():
    a, b = randn(4, 128), randn(16, 128)
    qb = per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    qa = per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    pb, pq = dg.pack_b(b), dg.pack_b(qb, recipe_a=(1, 32), recipe_b=(1, 32))
    d = torch.full((4, 16), 3.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dg_bf16_gemm_nt_packed: arguments 'a' and 'b' disagree on K"):
        dg.bf16_gemm_nt(randn(4, 96), pb, d)
    with pytest.raises(ValueError, match="'d'"):
        dg.bf16_gemm_nt(a, pb, d[:, :8])
    with pytest.raises(TypeError, match="'a'"):
        dg.bf16_gemm_nt(a.float(), pb, d)
    with pytest.raises(ValueError, match=r"fp8_fp4_gemm_nt: the recipe arguments give B granularity \(1, 128\), "
                                         r"but argument 'b' was packed with \(1, 32\)"):
        dg.fp8_fp4_gemm_nt(qa, pq, d)  # the default recipe is not the packing one
    with pytest.raises(ValueError, match="recipe_a"):
        dg.fp8_fp4_gemm_nt(qa, pq, d, recipe_a=(1, 32))  # half a pair: the library's own rule
    assert (d == 3.0).all()


def test_packed_for_another_isa_is_refused():
    isa = dg.get_isa()
    if isa == 'generic':
        pytest.skip('no lower ISA level to switch to')
    b, a = randn(16, 128), randn(2, 128)
    p = dg.pack_b(b)
    d = torch.full((2, 16), 3.0, dtype=torch.bfloat16)
    dg.set_isa('generic')
    try:
        with pytest.raises(ValueError, match="argument 'b' was packed for the .* kernel, but the current ISA runs"):
            dg.bf16_gemm_nt(a, p, d)
        assert (d == 3.0).all()
        assert dg.pack_b(b).isa == 'generic'
    finally:
        dg.set_isa(isa)
    dg.bf16_gemm_nt(a, p, d)  # valid again at its level
    with pytest.raises(ValueError, match="set_isa: argument 'isa'"):
        dg.set_isa('sse2')


def test_reference_backend_is_refused():
    """Packed weights live in the engine's format; the reference backend cannot read them."""
    p, a = dg.pack_b(randn(16, 128)), randn(2, 128)
    d = torch.full((2, 16), 3.0, dtype=torch.bfloat16)
    old = dg.get_backend()
    dg.set_backend('reference')
    try:
        with pytest.raises(NotImplementedError, match='reference backend'):
            dg.bf16_gemm_nt(a, p, d)
    finally:
        dg.set_backend(old)
    assert (d == 3.0).all()


def test_numpy_weights():
    np = pytest.importorskip('numpy')
    ml = pytest.importorskip('ml_dtypes')
    b = np.random.default_rng(0).standard_normal((24, 72)).astype(ml.bfloat16)
    a = np.random.default_rng(1).standard_normal((3, 72)).astype(ml.bfloat16)
    ref, d = np.zeros((3, 24), np.float32), np.zeros((3, 24), np.float32)
    dg.bf16_gemm_nt(a, b, ref)
    dg.bf16_gemm_nt(a, dg.pack_b(b), d)
    assert (ref.view(np.int32) == d.view(np.int32)).all()


def test_readme_example_runs():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, 'README.md')) as f:
        blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
    block = next(b for b in blocks if 'pack_b' in b)
    exec(compile(block, 'README.md pre-packed weights', 'exec'), {'__name__': '__main__'})

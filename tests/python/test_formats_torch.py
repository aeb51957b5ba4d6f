"""Bit-exactness of deepgemm-cpu's number formats and quantization helpers against PyTorch.

Run as: python3 test_formats_torch.py <path to libdeepgemm.so>

Checks, through ctypes on the shared library:
  * float32 -> float8_e4m3fn (dg_cast, AVX-512 and generic paths, and the scalar function)
    against torch's `.to(torch.float8_e4m3fn)` over every float32 bit pattern;
  * float32 -> bfloat16 against torch over every bit pattern (NaN: both NaN, since torch's own
    scalar and vector paths disagree on the NaN bits);
  * each quantization helper bit for bit against DeepGEMM's recipes (deep_gemm/utils/math.py),
    restated here in torch.
Exits non-zero on any failure, or when torch cannot be imported.
"""
import ctypes
import sys
import time

try:
    import torch
except Exception as exc:  # the test must fail loudly without torch
    print(f"FAIL: cannot import torch ({exc}); these checks need PyTorch")
    print("0 passed, 1 failed")
    sys.exit(1)

DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FP4_E2M1X2, DG_UE8M0, DG_INT32, DG_INT64, DG_UINT8, DG_INT8 = range(9)
DG_MAX_DIMS = 6
TORCH_TO_DG = {
    torch.float32: DG_FLOAT32, torch.bfloat16: DG_BFLOAT16, torch.float8_e4m3fn: DG_FLOAT8_E4M3,
    torch.int32: DG_INT32, torch.int8: DG_INT8, torch.uint8: DG_UINT8,
}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * DG_MAX_DIMS), ("strides", ctypes.c_int64 * DG_MAX_DIMS)]


def desc(t, dtype=None):
    """A dg_tensor over torch tensor t (strides in elements, as torch counts them)."""
    d = Tensor()
    d.data = t.data_ptr() if t.numel() else None
    d.dtype = TORCH_TO_DG[t.dtype] if dtype is None else dtype
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libdeepgemm.so")
lib.dg_last_error.restype = ctypes.c_char_p
lib.dg_float_to_e4m3.argtypes = [ctypes.c_float]
lib.dg_float_to_e4m3.restype = ctypes.c_uint8
lib.dg_float_to_bf16.argtypes = [ctypes.c_float]
lib.dg_float_to_bf16.restype = ctypes.c_uint16
lib.dg_get_isa.restype = ctypes.c_int
P = ctypes.POINTER(Tensor)
lib.dg_cast.argtypes = [P, P]
for name in ("dg_per_token_cast_to_fp8", "dg_per_token_cast_to_fp4"):
    getattr(lib, name).argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, P]
for name in ("dg_per_block_cast_to_fp8", "dg_per_channel_cast_to_fp8"):
    getattr(lib, name).argtypes = [P, ctypes.c_int, ctypes.c_int, P, P]
lib.dg_per_custom_dims_cast_to_fp8.argtypes = [P, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int, P, P]
lib.dg_cast_back_from_fp4.argtypes = [P, P, ctypes.c_int, ctypes.c_int, P]
for name in ("dg_pack_ue8m0_to_int", "dg_unpack_ue8m0_from_int", "dg_transpose_packed_fp4", "dg_ceil_to_ue8m0_tensor"):
    getattr(lib, name).argtypes = [P, P]
lib.dg_calc_diff.argtypes = [P, P, ctypes.POINTER(ctypes.c_double)]

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", flush=True)


def call(fn, *args):
    status = fn(*args)
    if status != 0:
        raise RuntimeError(f"status {status}: {lib.dg_last_error().decode()}")


def bits_equal(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


# ---- float32 -> E4M3 and BF16 over every bit pattern ---------------------------------------------

def sweep_casts():
    t0 = time.time()
    isa0 = lib.dg_get_isa()
    chunk = 1 << 24
    bad_e4m3 = bad_bf16 = bad_nan = 0
    # Preallocated buffers: allocating per chunk costs more than the conversions.
    out8, ref8 = torch.empty(chunk, dtype=torch.uint8), torch.empty(chunk, dtype=torch.float8_e4m3fn)
    out16, ref16 = torch.empty(chunk, dtype=torch.int16), torch.empty(chunk, dtype=torch.bfloat16)
    base, u = torch.arange(chunk, dtype=torch.int32), torch.empty(chunk, dtype=torch.int32)
    x = u.view(torch.float32)
    dx, d8, d16 = desc(x), desc(out8, DG_FLOAT8_E4M3), desc(out16, DG_BFLOAT16)
    for start in range(-(1 << 31), 1 << 31, chunk):
        torch.add(base, start, out=u)
        call(lib.dg_cast, dx, d8)
        ref8.copy_(x)
        bad_e4m3 += int(out8.ne(ref8.view(torch.uint8)).sum())
        call(lib.dg_cast, dx, d16)
        ref16.copy_(x)
        diff = out16.ne(ref16.view(torch.int16))
        if bool(diff.any()):  # only NaN inputs may differ (torch's NaN bits vary by code path)
            nan = torch.isnan(x)
            bad_bf16 += int((diff & ~nan).sum())
            ours_nan = ((out16 & 0x7F80) == 0x7F80) & ((out16 & 0x7F) != 0)
            bad_nan += int((nan & ~ours_nan).sum())
    check(bad_e4m3 == 0, f"dg_cast f32->e4m3 (isa {isa0}) vs torch: {bad_e4m3} mismatches")
    check(bad_bf16 == 0, f"dg_cast f32->bf16 vs torch: {bad_bf16} mismatches")
    check(bad_nan == 0, f"f32->bf16 NaN stays NaN: {bad_nan} failures")
    print(f"exhaustive float32 sweep: {time.time() - t0:.1f} s", flush=True)


def ranges_generic():
    """The portable path (dg_set_isa(generic)) on |x| in [2^-12, 2^10] plus a stride over all."""
    isa0 = lib.dg_get_isa()
    lib.dg_set_isa(0)
    try:
        lo = 0x39800000  # 2^-12
        hi = 0x44800000  # 2^10
        bad = 0
        for sign in (0, -(1 << 31)):
            for start in range(lo, hi, 1 << 24):
                u = (torch.arange(start, min(start + (1 << 24), hi + 1), 3, dtype=torch.int64) + sign).to(torch.int32)
                x = u.view(torch.float32)
                out8 = torch.empty(x.numel(), dtype=torch.uint8)
                call(lib.dg_cast, desc(x), desc(out8, DG_FLOAT8_E4M3))
                bad += int((out8 != x.to(torch.float8_e4m3fn).view(torch.uint8)).sum())
        u = torch.arange(-(1 << 31), 1 << 31, 65537, dtype=torch.int64).to(torch.int32)
        x = u.view(torch.float32)
        out8 = torch.empty(x.numel(), dtype=torch.uint8)
        call(lib.dg_cast, desc(x), desc(out8, DG_FLOAT8_E4M3))
        bad += int((out8 != x.to(torch.float8_e4m3fn).view(torch.uint8)).sum())
        check(bad == 0, f"generic dg_cast f32->e4m3 vs torch: {bad} mismatches")
    finally:
        lib.dg_set_isa(isa0)
    specials = [0.0, -0.0, 448.0, 464.0, 464.00003, 480.0, 1e30, float("inf"), -float("inf"), float("nan"),
                2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -9, 0.0019531, 1.0625, 1.1875, -240.0, 1e-45]
    xs = torch.tensor(specials, dtype=torch.float32)
    ref = xs.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    ours = [lib.dg_float_to_e4m3(float(v)) for v in xs.tolist()]
    check(ours == ref, f"scalar dg_float_to_e4m3 specials: {ours} vs {ref}")
    ref16 = xs[~torch.isnan(xs)].to(torch.bfloat16).view(torch.int16).tolist()
    ours16 = [ctypes.c_int16(lib.dg_float_to_bf16(float(v))).value for v in xs[~torch.isnan(xs)].tolist()]
    check(ours16 == ref16, "scalar dg_float_to_bf16 specials")


# ---- DeepGEMM's recipes, restated -------------------------------------------------------------

def ref_ceil_ue8m0(s):
    bits = s.abs().float().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).ne(0).int()
    return (e.clamp(1, 254) << 23).view(torch.float32)


def ref_scale(amax, fmt_max, ue8m0):
    sf = amax.clamp(1e-4) / fmt_max
    return ref_ceil_ue8m0(sf) if ue8m0 else sf


def ref_pack(sf):
    return (sf.view(torch.int32) >> 23).to(torch.uint8).view(torch.int32)


def pad_cols(x, g):
    m, k = x.shape
    kp = (k + g - 1) // g * g
    xp = torch.zeros((m, kp), dtype=x.dtype)
    xp[:, :k] = x
    return xp


def ref_per_token_fp8(x, ue8m0, g, packed):
    m, k = x.shape
    xv = pad_cols(x, g).view(m, -1, g)
    sf = ref_scale(xv.abs().float().amax(dim=2), 448.0, ue8m0)
    q = (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, -1)[:, :k].contiguous()
    if packed and sf.size(1) % 4:  # the last word's missing scales are 1.0, as DeepGEMM 2.8 pads
        sf = torch.nn.functional.pad(sf, (0, 4 - sf.size(1) % 4), value=1.0)
    return q, (ref_pack(sf) if packed else sf)


def ref_per_block_fp8(x, ue8m0, g):
    m, k = x.shape
    mp = (m + g - 1) // g * g
    xp = torch.zeros((mp, (k + g - 1) // g * g), dtype=x.dtype)
    xp[:m, :k] = x
    xv = xp.view(mp // g, g, -1, g)
    sf = ref_scale(xv.abs().float().amax(dim=(1, 3), keepdim=True), 448.0, ue8m0)
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn).view_as(xp)[:m, :k].contiguous()
    return q, sf.view(xv.shape[0], xv.shape[2])


def ref_per_channel_fp8(x, ue8m0, g):
    m, n = x.shape
    xv = x.reshape(m // g, g, n)
    sf = ref_scale(xv.abs().float().amax(dim=1), 448.0, ue8m0)
    return (xv * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(m, n), sf


def ref_custom_dims(x, dims, ue8m0):
    other = tuple(d for d in range(x.dim()) if d not in dims)
    sf = ref_scale(x.abs().float().amax(dim=other, keepdim=True), 448.0, ue8m0)
    return (x * (1.0 / sf)).to(torch.float8_e4m3fn), sf.squeeze()


def e2m1_codes(v):
    a = v.abs()
    code = torch.zeros_like(v, dtype=torch.uint8)
    for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (a > b).to(torch.uint8)
    return code | (((v < 0) & (code != 0)).to(torch.uint8) << 3)


def ref_per_token_fp4(x, ue8m0, g, packed):
    m, k = x.shape
    xp = pad_cols(x, g)
    xv = xp.view(m, -1, g)
    sf = ref_scale(xv.abs().float().amax(dim=2), 6.0, ue8m0)
    codes = e2m1_codes(xv * (1.0 / sf.unsqueeze(2))).view(m, -1)
    pairs = codes.view(m, -1, 2)
    pk = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).view(torch.int8)[:, : k // 2].contiguous()
    if packed:
        s = sf.shape[1]
        if s % 4:
            sf = torch.nn.functional.pad(sf, (0, 4 - s % 4), value=1.0)
        return pk, ref_pack(sf)
    return pk, sf


def ref_cast_back(pk, sf, g, packed):
    m, n2 = pk.shape
    if packed:
        sf = (sf.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    b = pk.view(torch.uint8)
    codes = torch.stack([b & 15, b >> 4], dim=2).view(m, 2 * n2).long()
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[codes & 7]
    vals = torch.where(((codes & 8) != 0) & ((codes & 7) != 0), -mags, mags)
    return vals * sf[:, torch.arange(2 * n2) // g]


def ref_transpose_fp4(a):
    m, n2 = a.shape
    b = a.view(torch.uint8)
    codes = torch.stack([b & 15, b >> 4], dim=2).view(m, 2 * n2).t().contiguous().view(2 * n2, m // 2, 2)
    return (codes[:, :, 0] | (codes[:, :, 1] << 4)).view(torch.int8)


# ---- running the library's versions -------------------------------------------------------------

def run2(fn, x, *args, out_dtype, out_shape, sf_dtype, sf_shape):
    out = torch.empty(out_shape, dtype=out_dtype)
    sf = torch.empty(sf_shape, dtype=sf_dtype)
    dt = DG_FP4_E2M1X2 if out_dtype == torch.int8 else None
    call(fn, desc(x), *args, desc(out, dt), desc(sf))
    return out, sf


def test_helpers():
    gen = torch.Generator().manual_seed(0)
    shapes = [(1, 128), (3, 300), (7, 64), (130, 200), (2, 7), (256, 96)]
    for (m, k) in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            base = torch.randn((m, k), generator=gen) * torch.logspace(-3, 3, k)
            base[0, : min(k, 5)] = 0
            for transposed in (False, True):
                x = base.to(dtype)
                if transposed:
                    x = x.t().contiguous().t()
                for ue in (False, True):
                    for g in (128, 32):
                        s = (k + g - 1) // g
                        q, sf = ref_per_token_fp8(x, ue, g, False)
                        oq, osf = run2(lib.dg_per_token_cast_to_fp8, x, int(ue), g, 0, out_dtype=torch.float8_e4m3fn,
                                       out_shape=(m, k), sf_dtype=torch.float32, sf_shape=(m, s))
                        check(bits_equal(oq, q) and bits_equal(osf, sf), f"per_token fp8 {m}x{k} {dtype} ue={ue} g={g}")
                        if ue:
                            q, sf = ref_per_token_fp8(x, ue, g, True)
                            oq, osf = run2(lib.dg_per_token_cast_to_fp8, x, 1, g, 1, out_dtype=torch.float8_e4m3fn,
                                           out_shape=(m, k), sf_dtype=torch.int32, sf_shape=(m, (s + 3) // 4))
                            check(bits_equal(oq, q) and bits_equal(osf, sf), f"per_token fp8 packed {m}x{k} g={g}")
                        q, sf = ref_per_block_fp8(x, ue, g)
                        oq, osf = run2(lib.dg_per_block_cast_to_fp8, x, int(ue), g, out_dtype=torch.float8_e4m3fn,
                                       out_shape=(m, k), sf_dtype=torch.float32, sf_shape=((m + g - 1) // g, s))
                        check(bits_equal(oq, q) and bits_equal(osf, sf), f"per_block fp8 {m}x{k} {dtype} ue={ue} g={g}")
                        if m % g == 0:
                            q, sf = ref_per_channel_fp8(x, ue, g)
                            oq, osf = run2(lib.dg_per_channel_cast_to_fp8, x, int(ue), g,
                                           out_dtype=torch.float8_e4m3fn, out_shape=(m, k), sf_dtype=torch.float32,
                                           sf_shape=(m // g, k))
                            check(bits_equal(oq, q) and bits_equal(osf, sf), f"per_channel {m}x{k} g={g}")
                        if k % 2 == 0:
                            for packed in ((False, True) if ue else (False,)):
                                q, sf = ref_per_token_fp4(x, ue, g, packed)
                                oq, osf = run2(lib.dg_per_token_cast_to_fp4, x, int(ue), g, int(packed),
                                               out_dtype=torch.int8, out_shape=(m, k // 2),
                                               sf_dtype=torch.int32 if packed else torch.float32,
                                               sf_shape=(m, (s + 3) // 4 if packed else s))
                                check(bits_equal(oq, q) and bits_equal(osf, sf),
                                      f"per_token fp4 {m}x{k} {dtype} ue={ue} g={g} packed={packed}")
                                back = torch.empty((m, k), dtype=torch.float32)
                                call(lib.dg_cast_back_from_fp4, desc(oq, DG_FP4_E2M1X2), desc(osf), g, int(packed),
                                     desc(back))
                                check(bits_equal(back, ref_cast_back(q, sf, g, packed)), f"cast_back {m}x{k} g={g}")
                                if m % 2 == 0:
                                    t = torch.empty((k, m // 2), dtype=torch.int8)
                                    call(lib.dg_transpose_packed_fp4, desc(oq, DG_FP4_E2M1X2), desc(t, DG_FP4_E2M1X2))
                                    check(bits_equal(t, ref_transpose_fp4(q)), f"transpose fp4 {m}x{k}")
    # Special values inside groups: zeros, huge values, infinities.
    x = torch.tensor([[0.0] * 8, [1e30, -2.0, 3.0, 0.0, 1.0, 1e-30, -1e30, 5.0],
                      [float("inf"), 1.0, 2.0, 3.0, -float("inf"), 0.5, 0.25, 1e-6]], dtype=torch.float32)
    for ue in (False, True):
        q, sf = ref_per_token_fp8(x, ue, 4, False)
        oq, osf = run2(lib.dg_per_token_cast_to_fp8, x, int(ue), 4, 0, out_dtype=torch.float8_e4m3fn,
                       out_shape=(3, 8), sf_dtype=torch.float32, sf_shape=(3, 2))
        check(bits_equal(oq, q) and bits_equal(osf, sf), f"per_token specials ue={ue}: {oq.view(torch.uint8)} {q.view(torch.uint8)}")


def test_custom_and_utils():
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn((4, 3, 6), generator=gen) * 10).to(torch.bfloat16)
    for dims in ((0,), (1, 2), (2,), (0, 1, 2), ()):
        for ue in (False, True):
            q, sf = ref_custom_dims(x, dims, ue)
            oq = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
            osf = torch.empty(sf.shape, dtype=torch.float32)
            arr = (ctypes.c_int * max(1, len(dims)))(*dims)
            call(lib.dg_per_custom_dims_cast_to_fp8, desc(x), arr, len(dims), int(ue), desc(oq), desc(osf))
            check(bits_equal(oq, q) and bits_equal(osf, sf), f"custom dims {dims} ue={ue}")
    s = ref_ceil_ue8m0(torch.randn((5, 8), generator=gen).abs() * 100)
    pk = torch.empty((5, 2), dtype=torch.int32)
    call(lib.dg_pack_ue8m0_to_int, desc(s), desc(pk))
    check(bits_equal(pk, ref_pack(s)), "pack_ue8m0_to_int")
    un = torch.empty((5, 8), dtype=torch.float32)
    call(lib.dg_unpack_ue8m0_from_int, desc(pk), desc(un))
    check(bits_equal(un, (pk.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)), "unpack_ue8m0_from_int")
    v = torch.randn((6, 7), generator=gen) * 1e3
    c = torch.empty_like(v)
    call(lib.dg_ceil_to_ue8m0_tensor, desc(v), desc(c))
    check(bits_equal(c, ref_ceil_ue8m0(v)), "ceil_to_ue8m0 tensor")
    a = torch.randn((33, 65), generator=gen, dtype=torch.float64).float()
    b = (a + torch.randn(a.shape, generator=gen) * 0.01).to(torch.bfloat16)
    d = ctypes.c_double()
    call(lib.dg_calc_diff, desc(a), desc(b), ctypes.byref(d))
    xd, yd = a.double(), b.double()
    ref = 1 - 2 * (xd * yd).sum() / (xd * xd + yd * yd).sum()
    check(abs(d.value - float(ref)) < 1e-12, f"calc_diff {d.value} vs {float(ref)}")


def main():
    t0 = time.time()
    sweep_casts()
    ranges_generic()
    test_helpers()
    test_custom_and_utils()
    print(f"total {time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

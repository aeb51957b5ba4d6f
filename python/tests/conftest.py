"""Shared helpers for the deep_gemm_cpu pytest suite: DeepGEMM's torch formulas restated (the
oracle for the utils helpers), and input generators in the style of DeepGEMM's tests."""
import pytest
import torch

import deep_gemm_cpu


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def ceil_div(x, y):
    return (x + y - 1) // y


def align(x, y):
    return ceil_div(x, y) * y


def calc_diff(x, y):
    """DeepGEMM's formula, in double."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    return 0.0 if den == 0 else float(1 - 2 * (x * y).sum() / den)


def ref_ceil_to_ue8m0(x):
    bits = x.abs().float().view(torch.int)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exp.clamp(1, 254) << 23).view(torch.float)


def ref_pack_ue8m0_to_int(x):
    return (x.view(torch.int) >> 23).to(torch.uint8).view(torch.int)


def ref_unpack_ue8m0_from_int(p):
    return (p.view(torch.uint8).to(torch.int) << 23).view(torch.float)


def ref_per_token_cast_to_fp8(x, use_ue8m0, gran_k=128, use_packed_ue8m0=False):
    m, n = x.shape
    pn = align(n, gran_k)
    xp = torch.zeros((m, pn), dtype=x.dtype)
    xp[:, :n] = x
    xv = xp.view(m, pn // gran_k, gran_k)
    amax = xv.abs().float().amax(dim=2).view(m, pn // gran_k).clamp(1e-4)
    sf = amax / 448.0
    sf = ref_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    q = (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, pn)[:, :n].contiguous()
    if use_packed_ue8m0 and sf.size(-1) % 4:  # DeepGEMM 2.8 pads the last word with 1.0
        sf = torch.nn.functional.pad(sf, (0, align(sf.size(-1), 4) - sf.size(-1)), value=1.0)
    return q, ref_pack_ue8m0_to_int(sf) if use_packed_ue8m0 else sf


def ref_per_block_cast_to_fp8(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    xp = torch.zeros((align(m, gran_k), align(n, gran_k)), dtype=x.dtype)
    xp[:m, :n] = x
    xv = xp.view(-1, gran_k, xp.size(1) // gran_k, gran_k)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    sf = ref_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn)
    return q.view_as(xp)[:m, :n].contiguous(), sf.view(xv.size(0), xv.size(2))


def ref_per_channel_cast_to_fp8(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    xv = x.view(-1, gran_k, n)
    amax = xv.abs().float().amax(dim=1).view(-1, n).clamp(1e-4)
    sf = amax / 448.0
    sf = ref_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    return (xv * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(m, n), sf


def ref_per_custom_dims_cast_to_fp8(x, dims, use_ue8m0):
    excluded = tuple(i for i in range(x.dim()) if i not in set(dims))
    amax = x.abs().float().amax(dim=excluded, keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    sf = ref_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    return (x * (1.0 / sf)).to(torch.float8_e4m3fn), sf.squeeze()


def _e2m1_codes(x):
    ax = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (ax > b).to(torch.uint8)
    sign = (x < 0) & (code != 0)
    return (code | (sign.to(torch.uint8) << 3)).view(torch.int8)


def ref_per_token_cast_to_fp4(x, use_ue8m0, gran_k=128, use_packed_ue8m0=False):
    m, n = x.shape
    pn = align(n, gran_k)
    xp = torch.zeros((m, pn), dtype=x.dtype)
    xp[:, :n] = x
    xv = xp.view(m, -1, gran_k)
    amax = xv.abs().float().amax(dim=2).clamp_min(1e-4)
    sf = amax / 6.0
    sf = ref_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    codes = _e2m1_codes(xv * (1.0 / sf.unsqueeze(2))).view(m, pn).view(m, pn // 2, 2)
    packed = (codes[:, :, 0] & 0x0F) | ((codes[:, :, 1] & 0x0F) << 4)
    if use_packed_ue8m0:
        if sf.size(-1) % 4:
            sf = torch.nn.functional.pad(sf, (0, align(sf.size(-1), 4) - sf.size(-1)), value=1.0)
        return packed[:, :n // 2].contiguous(), ref_pack_ue8m0_to_int(sf)
    return packed[:, :n // 2].contiguous(), sf


def fp4_dequant(packed, sf, gran_k, packed_sf=False):
    """Independent dequantization of packed FP4 rows [R, C/2] with per-gran_k scales."""
    if packed_sf:
        sf = ref_unpack_ue8m0_from_int(sf)
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    r, c2 = packed.shape
    codes = torch.empty((r, c2 * 2), dtype=torch.int64)
    codes[:, 0::2] = (packed & 0x0F).long()
    codes[:, 1::2] = ((packed >> 4) & 0x0F).long()
    val = lut[codes & 7]
    val = torch.where((codes & 8) != 0, -val, val)
    return val * sf[:, torch.arange(c2 * 2) // gran_k]


def fp8_dequant_rows(q, sf, gran_k):
    """q [R, C] E4M3 with per-row-per-gran_k scales sf [R, ceil(C/gran_k)]."""
    return q.float() * sf.repeat_interleave(gran_k, dim=1)[:, :q.size(1)]


def fp8_dequant_blocks(q, sf, gran=128):
    r, c = q.shape
    full = sf.repeat_interleave(gran, dim=0)[:r].repeat_interleave(gran, dim=1)[:, :c]
    return q.float() * full


def bytes_of(t):
    return t.contiguous().view(torch.uint8).clone()


class FakeCudaTensor:
    """Looks like a torch tensor on a CUDA device (attributes only)."""
    class _Dev:
        type = 'cuda'

        def __str__(self):
            return 'cuda:0'

    def __init__(self, t):
        self._t = t
        self.device = self._Dev()
        self.dtype = t.dtype
        self.shape = t.shape

    def data_ptr(self):
        return self._t.data_ptr()

    def stride(self):
        return self._t.stride()

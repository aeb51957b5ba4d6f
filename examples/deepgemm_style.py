# deepgemm_style.py - DeepGEMM-style code that runs on a CPU with deep_gemm_cpu.
# With DeepGEMM on a GPU, only the import and the device change.
import torch
import deep_gemm_cpu as deep_gemm   # GPU: import deep_gemm

device = 'cpu'                      # GPU: 'cuda'
m, n, k = 64, 2112, 7168
a = torch.randn((m, k), device=device, dtype=torch.bfloat16)
b = torch.randn((n, k), device=device, dtype=torch.bfloat16)
d = torch.empty((m, n), device=device, dtype=torch.bfloat16)
ref_d = a.float() @ b.float().t()

# BF16 GEMM: d = a @ b.T
deep_gemm.bf16_gemm_nt(a, b, d)
assert deep_gemm.testing.calc_diff(d, ref_d) < 1e-5

# FP8 GEMM: per-token (1x128) scales for a, per-block (128x128) for b, as (data, scales) pairs
a_fp8 = deep_gemm.utils.per_token_cast_to_fp8(a, use_ue8m0=False)
b_fp8 = deep_gemm.utils.per_block_cast_to_fp8(b, use_ue8m0=False)
deep_gemm.fp8_gemm_nt(a_fp8, b_fp8, d)
assert deep_gemm.testing.calc_diff(d, ref_d) < 1e-3

# MoE decoding: masked m-grouped BF16 GEMM, only the first masked_m[g] rows of group g
num_groups, max_m, n, k = 4, 32, 512, 1024
x = torch.randn((num_groups, max_m, k), device=device, dtype=torch.bfloat16)
w = torch.randn((num_groups, n, k), device=device, dtype=torch.bfloat16)
y = torch.empty((num_groups, max_m, n), device=device, dtype=torch.bfloat16)
masked_m = torch.tensor([32, 0, 7, 19], device=device, dtype=torch.int32)
deep_gemm.m_grouped_bf16_gemm_nt_masked(x, w, y, masked_m, expected_m=16)
for g in range(num_groups):
    rows = masked_m[g].item()
    if rows > 0:
        assert deep_gemm.testing.calc_diff(y[g, :rows], x[g, :rows].float() @ w[g].float().t()) < 1e-5

t = deep_gemm.testing.bench(lambda: deep_gemm.bf16_gemm_nt(a, b, d), num_warmups=1, num_tests=3)
print(f'bf16_gemm_nt {a.shape[0]}x{b.shape[0]}x{a.shape[1]}: {t * 1e3:.2f} ms')

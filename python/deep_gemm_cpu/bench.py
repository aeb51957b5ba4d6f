"""deep_gemm_cpu against PyTorch on decoding and prefill GEMMs, in one process, on the same
inputs and thread count.

    PYTHONPATH=build/python python -m deep_gemm_cpu.bench [--quick] [--reps N] [--json FILE] [FILTER...]

For each case D = A @ B^T (A [M, K] activations, B [N, K] weights, D BF16) it times:

- ours: ``bf16_gemm_nt`` on BF16 weights, ``fp8_gemm_nt`` on FP8 weights (A per-token 1x128,
  B per-block 128x128 float32 scales: DeepGEMM's 1D2D recipe) or ``fp8_fp4_gemm_nt`` on FP4
  weights (A FP8 1x128, B packed FP4 1x32, UE8M0-valued scales). A is already quantized, as
  DeepGEMM takes it;
- torch: ``torch.nn.functional.linear`` in BF16 on the BF16 activations and the same weights'
  BF16 copy (for FP8 / FP4 weights their dequantized values);
- torch dequant (FP8 / FP4 weights): the chain a PyTorch user would otherwise run, the weights
  dequantized to BF16 (torch ops) and then ``F.linear``, timed in full.

Einsum cases (``einsum/...``: DeepSeek's ``bmk,bnk->mn`` and the MLA absorb forms
``bhr,hdr->bhd``, ``bhd,hdr->bhr``, BF16) time ``einsum`` against ``torch.einsum`` on the same
tensors; their GB/s(w) counts the second operand's bytes.

Decoding cases (M <= 64) rotate through enough copies of the weights to exceed twice the
last-level cache, so every call reads its weights from DRAM. Each implementation gets one
warm-up call and reads the rest of its copies once (within 1 s), then up to --reps timed calls (fewer once they took 1 s; a warm-up of 2 s or more
is itself the measurement). torch's BF16 F.linear is timed once per shape (its time does not
depend on the weights' values) and its calc_diff taken against ours on each kind's own BF16
weights, on the first 64 rows. Printed per implementation: best time in ms, GFLOPS (2 M N K), GB/s of the weight bytes that implementation reads (codes and
scales for ours and the dequant chain, BF16 for torch), and ours/torch = torch's time over ours
(> 1: ours is faster). ``torch.set_num_threads`` is set to ``deep_gemm_cpu.get_num_sms()``
(``DG_NUM_THREADS``). A FILTER keeps the cases whose name contains it (e.g. ``fp8``, ``m1_``).
"""
import argparse
import glob
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

import deep_gemm_cpu as dg
from deep_gemm_cpu.testing import calc_diff
from deep_gemm_cpu.utils import per_block_cast_to_fp8, per_token_cast_to_fp4, per_token_cast_to_fp8

# (M, N, K): DeepSeek's projection shapes at decoding batches, and one prefill shape.
SHAPES = [(m, n, k) for n, k in ((2112, 7168), (7168, 2048)) for m in (1, 16, 64)] + [(4096, 2112, 7168)]
QUICK_SHAPES = [(1, 256, 512), (16, 384, 256)]
KINDS = ('bf16', 'fp8', 'fp4')
BUDGET_S = 1.0      # timed runs of one implementation stop once they took this long
SLOW_S = 2.0        # a warm-up call this long is the measurement (one call, no further runs)
DIFF_ROWS = 64      # calc_diff of torch's D against ours on (at most) this many leading rows
COLD_MAX_M = 64     # cases with M up to this read cold weights
# einsum: (expression, dims): bmk (S, M, N, K); heads (B, H, R, D), as dgbench's einsum cases
EINSUMS = [('bmk,bnk->mn', (4096, 128, 384, 128)), ('bmk,bnk->mn', (1024, 256, 256, 256)),
           ('bhr,hdr->bhd', (4096, 128, 512, 128)), ('bhd,hdr->bhr', (4096, 128, 512, 128)),
           ('bhr,hdr->bhd', (128, 8, 4096, 1024))]
QUICK_EINSUMS = [('bmk,bnk->mn', (16, 30, 48, 64)), ('bhr,hdr->bhd', (8, 4, 64, 40)), ('bhd,hdr->bhr', (8, 4, 64, 40))]


def llc_bytes():
    """The largest cache of cpu0 as /sys reports it (32 MiB when unknown)."""
    best = 0
    for d in glob.glob('/sys/devices/system/cpu/cpu0/cache/index*'):
        try:
            with open(os.path.join(d, 'size')) as f:
                s = f.read().strip()
        except OSError:
            continue
        mult = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}.get(s[-1:].upper(), 1)
        digits = s[:-1] if s[-1:].isalpha() else s
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or 32 << 20


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def copies_for(weight_bytes, cold, quick):
    """Enough copies that rotating through them overflows the LLC twice (2 GiB at most)."""
    if not cold:
        return 1
    n = int(min(2.0 * llc_bytes(), 2.0 * (1 << 30)) // weight_bytes) + 1
    return max(2, min(n, 2 if quick else 512))


# ---- the weights in each format, and the PyTorch user's dequantization ----

_FP4_LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                         -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.bfloat16)


def dequant_fp8_blocks(q, sf):
    """E4M3 [N, K] with 128 x 128 block scales [ceil(N/128), K/128] -> BF16 [N, K]."""
    n, k = q.shape
    s = sf.repeat_interleave(128, dim=0)[:n]                        # [N, K/128]
    return (q.float().view(n, k // 128, 128) * s.unsqueeze(2)).view(n, k).to(torch.bfloat16)


def dequant_fp4_rows(p, sf, gran_k=32):
    """Packed E2M1 [N, K/2] (low nibble first) with 1 x gran_k scales [N, K/gran_k] -> BF16 [N, K]."""
    n, k2 = p.shape
    u = p.view(torch.uint8)
    codes = torch.stack(((u & 0x0F), (u >> 4)), dim=2).view(n, 2 * k2).long()
    vals = _FP4_LUT[codes].view(n, -1, gran_k)
    return (vals * sf.to(torch.bfloat16).unsqueeze(2)).view(n, 2 * k2)


class Case:
    """One (kind, M, N, K): activations and weights in every form the implementations take."""

    def __init__(self, kind, m, n, k, quick):
        self.kind, self.m, self.n, self.k = kind, m, n, k
        self.name = f'{kind}/m{m}_n{n}_k{k}'
        g = torch.Generator().manual_seed(1000 * m + n + k)
        a = torch.randn(m, k, generator=g).to(torch.bfloat16)
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        self.a_bf16 = a
        cold = m <= COLD_MAX_M
        if kind == 'bf16':
            self.a_ours = a
            self.w_ours = [w]
            self.w_bf16 = w
        elif kind == 'fp8':
            self.a_ours = per_token_cast_to_fp8(a, use_ue8m0=False)
            qb, sfb = per_block_cast_to_fp8(w, use_ue8m0=False)
            self.w_ours = [(qb, sfb)]
            self.w_bf16 = dequant_fp8_blocks(qb, sfb)
        else:
            self.a_ours = per_token_cast_to_fp8(a, use_ue8m0=True)
            qb, sfb = per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32)
            self.w_ours = [(qb, sfb)]
            self.w_bf16 = dequant_fp4_rows(qb, sfb)
        first = self.w_ours[0]
        self.ours_wbytes = nbytes(*first) if isinstance(first, tuple) else nbytes(first)
        self.bf16_wbytes = nbytes(self.w_bf16)
        nc = copies_for(self.ours_wbytes, cold, quick)
        for _ in range(nc - 1):
            self.w_ours.append(tuple(t.clone() for t in first) if isinstance(first, tuple) else first.clone())
        self.bf16_copies = copies_for(self.bf16_wbytes, cold, quick)
        self.d = torch.empty(m, n, dtype=torch.bfloat16)
        self.flops = 2.0 * m * n * k

    def ours(self):
        """A callable running our GEMM, rotating through the weight copies."""
        it = _Rotor(self.w_ours)
        if self.kind == 'bf16':
            return it.wrap(lambda: dg.bf16_gemm_nt(self.a_ours, it.next(), self.d))
        if self.kind == 'fp8':
            return it.wrap(lambda: dg.fp8_gemm_nt(self.a_ours, it.next(), self.d))
        return it.wrap(lambda: dg.fp8_fp4_gemm_nt(self.a_ours, it.next(), self.d, recipe_a=(1, 128), recipe_b=(1, 32)))

    def torch_bf16(self):
        it = _Rotor([self.w_bf16] + [self.w_bf16.clone() for _ in range(self.bf16_copies - 1)])
        return it.wrap(lambda: F.linear(self.a_bf16, it.next()))

    def torch_dequant(self):
        it = _Rotor(self.w_ours)
        deq = dequant_fp8_blocks if self.kind == 'fp8' else dequant_fp4_rows
        return it.wrap(lambda: F.linear(self.a_bf16, deq(*it.next())))


class EinsumCase:
    """One einsum on BF16 operands: ours (deep_gemm_cpu.einsum into a preallocated D) and
    torch.einsum, the same tensors (compute-bound: no copies rotated)."""

    @staticmethod
    def name_of(expr, dims):
        tag = expr.replace(',', '_').replace('->', '_')
        keys = ('s', 'm', 'n', 'k') if expr == 'bmk,bnk->mn' else ('b', 'h', 'r', 'd')
        return f'einsum/{tag}/' + '_'.join(f'{c}{v}' for c, v in zip(keys, dims))

    def __init__(self, expr, dims):
        self.kind, self.expr, self.name = 'einsum', expr, EinsumCase.name_of(expr, dims)
        g = torch.Generator().manual_seed(sum(dims))
        if expr == 'bmk,bnk->mn':
            s_, m, n, k = dims
            sa, sb, sd = (s_, m, k), (s_, n, k), (m, n)
            self.flops = 2.0 * s_ * m * n * k
        else:
            b, h, r, d = dims
            sa, sb = ((b, h, r), (h, d, r)) if expr == 'bhr,hdr->bhd' else ((b, h, d), (h, d, r))
            sd = (b, h, d) if expr == 'bhr,hdr->bhd' else (b, h, r)
            self.flops = 2.0 * b * h * r * d
        self.a = torch.randn(*sa, generator=g).to(torch.bfloat16)
        self.b = torch.randn(*sb, generator=g).to(torch.bfloat16)
        self.d = torch.empty(*sd, dtype=torch.bfloat16)
        self.ours_wbytes = self.bf16_wbytes = nbytes(self.b)

    def ours(self):
        return lambda: dg.einsum(self.expr, self.a, self.b, self.d)

    def torch_bf16(self):
        return lambda: torch.einsum(self.expr, self.a, self.b)


def with_rates(rows, flops):
    """Adds ms, GFLOPS, weight GB/s and ours/torch (rows[0] is ours) to each row."""
    for r in rows:
        r['ms'] = 1e3 * r['seconds']
        r['gflops'] = 1e-9 * flops / r['seconds']
        r['weight_gbps'] = 1e-9 * r['weight_bytes'] / r['seconds']
        r['ours_over_torch'] = None if r is rows[0] else r['seconds'] / rows[0]['seconds']
    return rows


def run_einsum(case, reps):
    t_ours, _ = best_time(case.ours(), reps)
    t_torch, out = best_time(case.torch_bf16(), reps)
    rows = [dict(impl='ours einsum', seconds=t_ours, weight_bytes=case.ours_wbytes, diff=None),
            dict(impl='torch einsum bf16', seconds=t_torch, weight_bytes=case.bf16_wbytes,
                 diff=calc_diff(out[:DIFF_ROWS].float(), case.d[:DIFF_ROWS].float()))]
    return with_rates(rows, case.flops)


class _Rotor:
    def __init__(self, items):
        self.items, self.i = items, 0

    def next(self):
        x = self.items[self.i]
        self.i = (self.i + 1) % len(self.items)
        return x

    def wrap(self, fn):
        """fn, marked with the number of calls that read every copy once (best_time)."""
        fn.rotation = len(self.items)
        return fn


def best_time(fn, reps):
    """One warm-up, then up to `reps` timed calls (fewer once they took BUDGET_S): the best,
    and the last output. A warm-up of SLOW_S or more is the measurement itself. A callable
    rotating weight copies (fn.rotation) first reads every copy once, within BUDGET_S: the
    first read of freshly written memory ran 1.5-3x slower on a Sapphire Rapids VM (dgbench
    does the same)."""
    t0 = time.perf_counter()
    out = fn()
    best = time.perf_counter() - t0
    if best >= SLOW_S:
        time.sleep(0.05)
        return best, out
    warm = best
    for _ in range(getattr(fn, 'rotation', 1) - 1):
        if warm >= BUDGET_S:
            break
        t0 = time.perf_counter()
        out = fn()
        warm += time.perf_counter() - t0
    best, spent = float('inf'), 0.0
    for i in range(reps):
        t0 = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t0
        best, spent = min(best, t), spent + t
        if spent >= BUDGET_S:
            break
    time.sleep(0.05)  # let OpenMP threads stop spinning (libgomp spins ~10 ms after a parallel region)
    return best, out


def run_case(case, reps, torch_times):
    """Times ours and torch on one case. torch's BF16 F.linear takes the same time whatever the
    weights' values, so it is timed once per shape (torch_times caches it) and compared with
    ours on each kind's own BF16 weights."""
    rows = []
    t_ours, _ = best_time(case.ours(), reps)
    ours_d = case.d.float()
    rows.append(dict(impl='ours ' + {'bf16': 'bf16_gemm_nt', 'fp8': 'fp8_gemm_nt',
                                     'fp4': 'fp8_fp4_gemm_nt'}[case.kind],
                     seconds=t_ours, weight_bytes=case.ours_wbytes, diff=None))
    shape = (case.m, case.n, case.k)
    if shape not in torch_times:
        torch_times[shape] = best_time(case.torch_bf16(), reps)[0]
    r = min(case.m, DIFF_ROWS)
    rows.append(dict(impl='torch F.linear bf16', seconds=torch_times[shape], weight_bytes=case.bf16_wbytes,
                     diff=calc_diff(F.linear(case.a_bf16[:r], case.w_bf16).float(), ours_d[:r])))
    if case.kind != 'bf16':
        t, out = best_time(case.torch_dequant(), reps)
        rows.append(dict(impl='torch dequant+F.linear', seconds=t, weight_bytes=case.ours_wbytes,
                         diff=calc_diff(out[:r].float(), ours_d[:r])))
    return with_rates(rows, case.flops)


def parse_args(argv):
    p = argparse.ArgumentParser(prog='python -m deep_gemm_cpu.bench',
                                description='deep_gemm_cpu against torch F.linear, same inputs and threads')
    p.add_argument('--quick', action='store_true', help='small shapes, two timed runs (a smoke test)')
    p.add_argument('--reps', type=int, default=None, help='timed runs per implementation (default 5; quick 2)')
    p.add_argument('--json', metavar='FILE', help='also write the results as JSON to FILE')
    p.add_argument('filters', nargs='*', metavar='FILTER', help='run the cases whose name contains one')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reps = args.reps if args.reps is not None else (2 if args.quick else 5)
    threads = dg.get_num_sms()
    torch.set_num_threads(threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    todo = [(kind, m, n, k) for (m, n, k) in shapes for kind in KINDS
            if not args.filters or any(f in f'{kind}/m{m}_n{n}_k{k}' for f in args.filters)]
    einsums = [(e, dims) for e, dims in (QUICK_EINSUMS if args.quick else EINSUMS)
               if not args.filters or any(f in EinsumCase.name_of(e, dims) for f in args.filters)]
    if not todo and not einsums:
        print('no case matches the filter', file=sys.stderr)
        return 2
    print(f'deep_gemm_cpu {getattr(dg, "__version__", "")} isa {dg.get_isa()} | torch {torch.__version__} | '
          f'{threads} threads (torch.set_num_threads) | LLC {llc_bytes() >> 20} MiB: M <= {COLD_MAX_M} '
          f'rotates weight copies past 2x LLC | {platform.processor() or platform.machine()}')
    print(f'{"case / implementation":<40} {"ms":>9} {"GFLOPS":>9} {"GB/s(w)":>9} {"ours/torch":>11} {"diff":>9}')
    results, torch_times = [], {}
    for item in todo + einsums:
        if len(item) == 2:  # an einsum, built only now (the large ones take GBs)
            case = EinsumCase(*item)
            rows = run_einsum(case, reps)
            m = n = k = None
        else:
            kind, m, n, k = item
            case = Case(kind, m, n, k, args.quick)
            rows = run_case(case, reps, torch_times)
        print(case.name)
        for r in rows:
            ratio = f'{r["ours_over_torch"]:.2f}x' if r['ours_over_torch'] else '-'
            diff = f'{r["diff"]:.2e}' if r['diff'] is not None else '-'
            print(f'  {r["impl"]:<38} {r["ms"]:9.3f} {r["gflops"]:9.2f} {r["weight_gbps"]:9.2f} '
                  f'{ratio:>11} {diff:>9}')
        sys.stdout.flush()
        results.append(dict(case=case.name, kind=case.kind, m=m, n=n, k=k,
                            weight_copies=len(case.w_ours) if hasattr(case, 'w_ours') else 1, impls=rows))
        del case
    print('ours/torch: the torch implementation\'s time over ours (> 1: deep_gemm_cpu is faster); '
          'GB/s(w): weight bytes read per second (FP8/FP4 codes and scales for ours and the '
          'dequant chain, BF16 for torch F.linear); diff: calc_diff against our D')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(threads=threads, isa=dg.get_isa(), torch=torch.__version__, llc_bytes=llc_bytes(),
                           quick=args.quick, reps=reps, cases=results), f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())

"""How accurate deep_gemm_cpu's BF16 einsum is, next to PyTorch's, on DeepGEMM's einsum cases.

    PYTHONPATH=build/python python -m deep_gemm_cpu.accuracy [--full] [--seed S] [FILTER...]

For each case of upstream's tests/test_einsum.py ('bhr,hdr->bhd' and 'bhd,hdr->bhr' with
(h, r, d) = (128, 512, 128) and (8, 4096, 1024); 'bmk,bnk->mn' with a BF16 output) it draws
upstream's inputs (torch.randn, BF16; B a slice of a wider tensor as upstream does), computes
the exact result in float64 and rounds it to BF16 (the best a BF16 output can be), and prints
for ours (``deep_gemm_cpu.einsum``) and torch's BF16 ``torch.einsum``:

- calc_diff against that rounded float64 result (DeepGEMM's measure; lower is better);
- the share of outputs that differ from it (each such output is one BF16 step off);
- and calc_diff(ours, torch), the quantity upstream's test bounds by 1e-10 (``ok`` when below).

Each case is measured over the outputs of independent draws of inputs taken together, as many
draws as make --outputs outputs (default 2^24, at most 64 draws; about two minutes here). One
draw is not enough to rank two libraries: calc_diff sums squared errors, and with BF16 outputs
nearly all of it comes from the few outputs (10 to 50 in a draw) that land one BF16 step off,
so which of them happen to be large decides it. (At 2^21 the cases with h=8, r=4096, b=128
got one draw, and their ranking changed with the seed.)

By default b runs over (4, 32, 128); --full adds upstream's 4096 and 8192 (many minutes here:
the float64 reference is the slow part). Both libraries use ``deep_gemm_cpu.get_num_sms()``
threads. The accumulation order that sets our figures is in include/deepgemm.h (dense GEMMs).
"""
import argparse
import sys

import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.testing import calc_diff


def _cases(full):
    bs = (4, 32, 128, 4096, 8192) if full else (4, 32, 128)
    for expr in ('bhr,hdr->bhd', 'bhd,hdr->bhr'):
        for h, r, d in ((128, 512, 128), (8, 4096, 1024)):
            for b in bs:
                yield expr, dict(b=b, h=h, r=r, d=d)
    ss = (129, 4096, 8192) if full else (129,)
    for s in ss:
        for m, n, k in ((128, 384, 128), (256, 256, 256), (384, 128, 384)):
            yield 'bmk,bnk->mn', dict(s=s, m=m, n=n, k=k)


def _inputs(expr, p):
    if expr == 'bmk,bnk->mn':
        a = torch.randn((p['s'], p['m'], p['k']), dtype=torch.bfloat16)
        b = torch.randn((p['s'], p['n'], p['k']), dtype=torch.bfloat16)
        out = torch.empty((p['m'], p['n']), dtype=torch.bfloat16)
        return a, b, out
    first = (p['b'], p['h'], p['r'] if expr == 'bhr,hdr->bhd' else p['d'])
    x = torch.randn(first, dtype=torch.bfloat16)
    y = torch.randn((p['h'], p['d'], p['r'] + 128), dtype=torch.bfloat16)[:, :, :p['r']]
    last = p['d'] if expr == 'bhr,hdr->bhd' else p['r']
    return x, y, torch.empty((p['b'], p['h'], last), dtype=torch.bfloat16)


def _numel(expr, p):
    if expr == 'bmk,bnk->mn':
        return p['m'] * p['n']
    return p['b'] * p['h'] * (p['d'] if expr == 'bhr,hdr->bhd' else p['r'])


def _share_off(x, ref):
    return (x != ref).double().mean().item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--full', action='store_true', help="upstream's large batch sizes too")
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--outputs', type=int, default=1 << 24,
                    help='outputs measured per case: as many draws of inputs as that takes, '
                         'at most 64 (default 2^21)')
    ap.add_argument('filters', nargs='*')
    args = ap.parse_args(argv)
    if args.outputs < 1:
        ap.error('--outputs must be at least 1')
    torch.set_num_threads(dg.get_num_sms())
    print(f'{"case":<46} {"ours":>10} {"torch":>10} {"ours off":>9} {"torch off":>9} '
          f'{"ours~torch":>10}  vs 1e-10')
    worse = 0
    for index, (expr, p) in enumerate(_cases(args.full)):
        name = expr + ' ' + ' '.join(f'{k}={v}' for k, v in p.items())
        if args.filters and not any(f in name for f in args.filters):
            continue
        ours, theirs, best = [], [], []
        draws = min(64, -(-args.outputs // _numel(expr, p)))
        for draw in range(draws):
            # Each (seed, case, draw) has its own inputs, whatever the filters select.
            torch.manual_seed(args.seed * 1_000_003 + index * 1009 + draw)
            a, b, out = _inputs(expr, p)
            best.append(torch.einsum(expr, a.double(), b.double()).bfloat16().flatten())
            theirs.append(torch.einsum(expr, a, b).flatten())
            dg.einsum(expr, a, b, out)
            ours.append(out.flatten())
        ours, theirs, best = torch.cat(ours), torch.cat(theirs), torch.cat(best)
        ours_d, theirs_d = calc_diff(ours, best), calc_diff(theirs, best)
        worse += ours_d > theirs_d
        mutual = calc_diff(ours, theirs)
        print(f'{name:<46} {ours_d:10.2e} {theirs_d:10.2e} {100 * _share_off(ours, best):8.4f}% '
              f'{100 * _share_off(theirs, best):8.4f}% {mutual:10.2e}  {"ok" if mutual < 1e-10 else "over"}')
    print(f'ours, torch: calc_diff against float64 rounded to BF16, over the outputs of '
          f'several draws of inputs together (--outputs); "off": outputs not equal to it; ours~torch: calc_diff(ours, torch); '
          f'{worse} case(s) where ours is further from it than torch')
    return 0


if __name__ == '__main__':
    sys.exit(main())

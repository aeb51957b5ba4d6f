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

By default b runs over (4, 32, 128); --full adds upstream's 4096 and 8192 (minutes here: the
float64 reference is the slow part). Both libraries use ``deep_gemm_cpu.get_num_sms()``
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


def _share_off(x, ref):
    return (x != ref).double().mean().item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--full', action='store_true', help="upstream's large batch sizes too")
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('filters', nargs='*')
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(dg.get_num_sms())
    print(f'{"case":<46} {"ours":>10} {"torch":>10} {"ours off":>9} {"torch off":>9} '
          f'{"ours~torch":>10}  vs 1e-10')
    worse = 0
    for expr, p in _cases(args.full):
        name = expr + ' ' + ' '.join(f'{k}={v}' for k, v in p.items())
        if args.filters and not any(f in name for f in args.filters):
            continue
        a, b, out = _inputs(expr, p)
        exact = torch.einsum(expr, a.double(), b.double())
        theirs = torch.einsum(expr, a, b)
        dg.einsum(expr, a, b, out)
        best = exact.bfloat16()
        ours_d, theirs_d = calc_diff(out, best), calc_diff(theirs, best)
        worse += ours_d > theirs_d
        mutual = calc_diff(out, theirs)
        print(f'{name:<46} {ours_d:10.2e} {theirs_d:10.2e} {100 * _share_off(out, best):8.4f}% '
              f'{100 * _share_off(theirs, best):8.4f}% {mutual:10.2e}  {"ok" if mutual < 1e-10 else "over"}')
    print(f'ours, torch: calc_diff against float64 rounded to BF16; "off": outputs '
          f'not equal to it; ours~torch: calc_diff(ours, torch); {worse} case(s) where ours is '
          f'further from it than torch')
    return 0


if __name__ == '__main__':
    sys.exit(main())

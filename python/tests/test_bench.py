"""python -m deep_gemm_cpu.bench stays runnable: its quick mode end to end (small shapes, one
timed run each), its JSON, and the PyTorch-side dequantizations it times against the suite's
own formulas."""
import json

import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu import bench
from deep_gemm_cpu.utils import per_block_cast_to_fp8, per_token_cast_to_fp4
from conftest import calc_diff, fp4_dequant, fp8_dequant_blocks


def test_quick_run_writes_json(tmp_path, capsys):
    out = tmp_path / 'bench.json'
    assert bench.main(['--quick', '--json', str(out), 'm1_']) == 0
    printed = capsys.readouterr().out
    assert 'ours/torch' in printed and 'torch F.linear bf16' in printed
    res = json.loads(out.read_text())
    assert res['threads'] == dg.get_num_sms() and res['quick']
    assert [c['kind'] for c in res['cases']] == ['bf16', 'fp8', 'fp4']
    for c in res['cases']:
        assert c['m'] == 1 and c['weight_copies'] >= 2   # M = 1 rotates cold weights
        impls = [r['impl'] for r in c['impls']]
        assert impls[1] == 'torch F.linear bf16'
        assert len(impls) == (2 if c['kind'] == 'bf16' else 3)
        for r in c['impls']:
            assert r['seconds'] > 0 and r['gflops'] > 0 and r['weight_gbps'] > 0
        assert all(r['ours_over_torch'] > 0 for r in c['impls'][1:])


def test_filter_without_match():
    assert bench.main(['--quick', 'no_such_case']) == 2


def test_llc_and_copies():
    llc = bench.llc_bytes()
    assert llc > 0
    assert bench.copies_for(1 << 20, cold=False, quick=False) == 1
    n = bench.copies_for(1 << 20, cold=True, quick=False)
    assert n * (1 << 20) > 2 * llc or n == 512


def test_dequant_matches_reference_formulas():
    w = torch.randn(200, 256, dtype=torch.bfloat16)   # N tail: 200 is no multiple of 128
    q8, s8 = per_block_cast_to_fp8(w, use_ue8m0=False)
    assert calc_diff(bench.dequant_fp8_blocks(q8, s8).float(), fp8_dequant_blocks(q8, s8)) < 1e-5
    q4, s4 = per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32)
    assert torch.equal(bench.dequant_fp4_rows(q4, s4).float(), fp4_dequant(q4, s4, 32))


def test_quick_einsum_cases(tmp_path, capsys):
    out = tmp_path / 'einsum.json'
    assert bench.main(['--quick', '--json', str(out), 'einsum/']) == 0
    assert 'torch einsum bf16' in capsys.readouterr().out
    cases = json.loads(out.read_text())['cases']
    assert [c['case'].split('/')[1] for c in cases] == ['bmk_bnk_mn', 'bhr_hdr_bhd', 'bhd_hdr_bhr']
    for c in cases:
        assert c['kind'] == 'einsum' and [r['impl'] for r in c['impls']] == ['ours einsum', 'torch einsum bf16']
        assert all(r['seconds'] > 0 and r['gflops'] > 0 for r in c['impls'])
        assert c['impls'][1]['diff'] < 1e-5   # the same einsum: torch's BF16 result against ours

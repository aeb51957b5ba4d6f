"""python -m deep_gemm_cpu.layer_bench stays runnable: a tiny --quick run of both configurations
(one prefill, one decoding phase) end to end, the structure of its JSON, our layer's outputs
against the PyTorch-built layer's, and the torch-side dequantizations against the suite's own
formulas and the library's.

Thresholds (calc_diff of our outputs against torch's, which runs BF16 activations on the very
same weights, so the differences are our FP8 activation casts): DeepGEMM's 0.01 for FP8 x FP4
GEMMs on the MoE output and the layer output (dominated by the MoE); the attention output passes
three FP8 GEMMs in sequence (q_a, q_b, o), each within DeepGEMM's FP8 threshold 1e-3, so 3e-3;
the routing weights (on tokens whose experts agree) carry the attention output's difference
(3e-3); the indexer logits, FP8 q and
k against float32 ones, DeepGEMM's FP4-or-looser 0.01."""
import json

import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu import layer_bench as lb
from deep_gemm_cpu.utils import per_block_cast_to_fp8, per_token_cast_to_fp4, cast_back_from_fp4
import pytest

from conftest import calc_diff, fp4_dequant, fp8_dequant_blocks

LIMITS = dict(out=1e-2, y_moe=1e-2, y_attn=3e-3, route_weights=3e-3, indexer_logits=1e-2)
SHARED_ROWS = {'prefill': ['shared expert gate/up (m_grouped_fp8_fp4 contiguous)',
                           'shared expert down (m_grouped_fp8_fp4 contiguous)'],
               'decode': ['shared expert gate/up (m_grouped_fp8_fp4 masked)',
                          'shared expert down (m_grouped_fp8_fp4 masked)']}
ROUTED_ROWS = {  # --moe grouped: the routed experts on the grouped GEMMs; --moe mega (default): one call
    'grouped': {'prefill': ['routed experts gate/up (m_grouped_fp8_fp4 contiguous)',
                            'routed experts down (m_grouped_fp8_fp4 contiguous)'],
                'decode': ['routed experts gate/up (m_grouped_fp8_fp4 masked)',
                           'routed experts down (m_grouped_fp8_fp4 masked)']},
    'mega': {'prefill': [lb.MEGA], 'decode': [lb.MEGA]},
}
DG_ROWS = {  # rows served by deep_gemm_cpu calls that report a path
    'prefill': ['q_a+kv_a proj (fp8_gemm_nt)', 'q_b proj (fp8_gemm_nt)', 'o proj (fp8_gemm_nt)',
                'indexer q proj (fp8_gemm_nt)', 'indexer k proj (fp8_gemm_nt)',
                'indexer weights proj (bf16_gemm_nt)', lb.ROUTER,
                'mhc prenorm (tf32_hc_prenorm_gemm)', 'indexer logits (fp8_mqa_logits)',
                'act quant (per_token_cast_to_fp8)'] + SHARED_ROWS['prefill'],
    'decode': ['indexer logits (fp8_paged_mqa_logits)'] + SHARED_ROWS['decode'],
}
ENTRY = {'fp8_gemm_nt': 'dg_fp8_fp4_gemm_nt', 'bf16_gemm_nt': 'dg_bf16_gemm_nt', 'bf16_mega_gate': 'dg_bf16_mega_gate',
         'tf32_hc_prenorm_gemm': 'dg_tf32_hc_prenorm_gemm', 'fp8_mqa_logits': 'dg_fp8_mqa_logits',
         'fp8_paged_mqa_logits': 'dg_fp8_paged_mqa_logits', 'per_token_cast_to_fp8': 'dg_per_token_cast_to_fp8',
         'm_grouped_fp8_fp4 contiguous': 'dg_m_grouped_fp8_fp4_gemm_nt_contiguous',
         'm_grouped_fp8_fp4 masked': 'dg_m_grouped_fp8_fp4_gemm_nt_masked'}


@pytest.mark.parametrize('moe', ['mega', 'grouped'])
def test_quick_run(tmp_path, capsys, moe):
    out = tmp_path / 'layer.json'
    mode = dg.get_print_paths()
    # torch runs 32 of the prefill's 64 query tokens (scaled x2, compared on those rows)
    assert lb.main(['--quick', '--phase', 'prefill64,decode4', '--reps', '0', '--limits', 'python',
                    '--torch-tokens', '32', '--json', str(out), '--moe', moe]) == 0
    assert dg.get_print_paths() == mode   # the capture restores the caller's mode
    printed = capsys.readouterr().out
    assert 'tokens/s' in printed and 'ours/torch' in printed and 'summary' in printed
    res = json.loads(out.read_text())
    assert res['quick'] and res['threads'] == dg.get_num_sms() and res['isa'] == dg.get_isa()
    assert res['limits']['fp32_gflops'] > 0 and res['limits']['dram_gbps'] > 0 and res['limits']['source']
    assert [c['key'] for c in res['configs']] == ['v3.2', 'v4-flash']
    for c in res['configs']:
        assert [(p['phase'], p['tokens']) for p in c['phases']] == [('prefill', 64), ('decode', 4)]
        assert c['real']['experts'] == 256
        for p in c['phases']:
            o, t = p['ours'], p['torch']
            assert o['seconds'] > 0 and abs(o['tokens_per_s'] - p['tokens'] / o['seconds']) < 1e-6 * o['tokens_per_s']
            assert t['seconds'] > 0 and t['seconds_with_dequant'] >= t['seconds']
            if p['phase'] == 'prefill':
                assert t['sample_tokens'] == 32 and t['scale'] == 2.0
            else:
                assert t['sample_tokens'] is None and t['scale'] == 1.0
            assert p['ours_over_torch'] == t['seconds'] / o['seconds']
            rows = {r['name']: r for r in o['kernels']}
            assert 0.5 < sum(r['share'] for r in rows.values()) <= 1.0 + 1e-9
            assert 0 < o['weighted_lim_pct'] and o['weight_bytes'] > 0
            ph = 'prefill' if p['phase'] == 'prefill' else 'decode'
            other = ROUTED_ROWS['grouped' if moe == 'mega' else 'mega'][ph]
            assert not any(name in rows for name in other), (moe, sorted(rows))
            for name in DG_ROWS[ph] + ROUTED_ROWS[moe][ph] + ['q_b proj (fp8_gemm_nt)', lb.ROUTER]:
                r = rows[name]
                assert r['seconds'] > 0 and r['calls'] >= 1, name
                assert r['paths'], name   # the library named the path it took
                if name == lb.MEGA:   # the fused call's own line, and those of the kernels it runs
                    assert any(line.startswith('dg_fp8_fp4_mega_moe_packed: ') for line in r['paths']), r['paths']
                    assert any(line.startswith('dg_fp8_fp4_gemm_nt_packed: ') for line in r['paths']), r['paths']
                    continue
                entry = ENTRY[name[name.index('(') + 1:-1]]
                assert all(line.startswith(entry + ': ') for line in r['paths']), (name, r['paths'])
                if r['flops']:
                    assert r['gflops'] > 0 and r['torch_seconds'] > 0 and r['ours_over_torch'] > 0
                assert r['lim_pct'] is not None and r['limit'] in ('fp32', 'bf16', 'amx_bf16', 'dram'), name
            # the same layer from torch ops, expert for expert
            for what, lim in LIMITS.items():
                assert 0 <= p['diff'][what] < lim, (c['key'], p['phase'], what, p['diff'])
            assert p['routing_agreement'] > 0.75


def test_torch_dequantizes_in_the_call_when_bf16_experts_do_not_fit(tmp_path, monkeypatch):
    """--full's torch side: the experts' BF16 copies past the budget are dequantized in the call,
    timed as dequantization and not counted twice."""
    monkeypatch.setattr(lb, 'BF16_EXPERT_BUDGET', 0)
    out = tmp_path / 'layer.json'
    assert lb.main(['--quick', '--config', 'v4-flash', '--phase', 'decode2', '--reps', '0', '--limits', 'python',
                    '--json', str(out), '--moe', 'grouped']) == 0
    p = json.loads(out.read_text())['configs'][0]['phases'][0]
    t = p['torch']
    assert not t['experts_bf16_in_memory'] and t['dequant_seconds'] > 0
    assert abs(t['seconds_with_dequant'] - t['seconds'] - t['dequant_seconds']) < 1e-9
    gu = {r['name']: r for r in t['kernels']}['routed experts gate/up (m_grouped_fp8_fp4 masked)']
    assert gu['dequant_seconds'] > 0
    assert p['diff']['out'] < LIMITS['out']


def test_dequant_matches_reference_formulas():
    w = torch.randn(256, 512, dtype=torch.bfloat16)
    q8, s8 = per_block_cast_to_fp8(w, use_ue8m0=False)
    assert calc_diff(lb.dequant_fp8_blocks(q8, s8).float(), fp8_dequant_blocks(q8, s8)) < 1e-5
    q4, s4 = per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    mine = lb.dequant_fp4_packed(q4, s4)
    assert torch.equal(mine.float(), fp4_dequant(q4, s4, 32, packed_sf=True))
    assert torch.equal(mine.float(), cast_back_from_fp4(q4, s4, gran_k=32, use_packed_ue8m0=True))
    assert torch.equal(lb._dequant_fp4_setup(q4, s4), mine)


def test_random_weights_are_well_formed():
    g = torch.Generator().manual_seed(3)
    q, sf = lb.rand_fp8_weight(200, 256, g)
    bits = q.view(torch.uint8)
    assert ((bits & 0x7F) != 0x7F).all() and ((bits >> 3) & 0xF).min() >= 9   # no NaN, no subnormals
    assert sf.shape == (2, 2) and (sf > 0).all()
    std = lb.dequant_fp8_blocks(q, sf).float().std().item()
    assert 0.5 / 16 < std < 2.0 / 16   # about 1/sqrt(K)
    codes, sf4 = lb.rand_fp4_weights(3, 64, 512, g)
    assert codes.shape == (3, 64, 256) and sf4.shape == (3, 64, 4) and sf4.dtype == torch.int32
    std4 = lb.dequant_fp4_packed(codes[1], sf4[1]).float().std().item()
    assert 0.25 / 512 ** 0.5 < std4 < 4.0 / 512 ** 0.5


def test_phase_and_config_parsing():
    a = lb.parse_args(['--config', 'v32', '--phase', 'decode8,prefill512'])
    assert a.configs == ['v3.2'] and a.phases == [('decode', 8), ('prefill', 512)]
    a = lb.parse_args([])
    assert a.configs == ['v3.2', 'v4-flash'] and len(a.phases) == 6 and a.torch_tokens == 64
    cfg = lb.make_config('v3.2', quick=False, full=False)
    assert (cfg['experts'], cfg['topk'], cfg['inter'], cfg['hidden']) == (16, 8, 2048, 7168)
    full = lb.make_config('v4-flash', quick=False, full=True)
    assert (full['experts'], full['topk'], full['hidden']) == (256, 6, 4096)


def test_grouped_path_lines_name_their_entry_point():
    """Groups run on worker threads (which one is dynamic): their path lines must still name the
    entry point (the layer benchmark once found them labelled 'deepgemm'); several calls."""
    g, m, n, k = 4, 16, 256, 512
    w = per_token_cast_to_fp4(torch.randn(g * n, k), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    w = (w[0].view(g, n, -1), w[1].view(g, n, -1))
    a = dg.utils.per_token_cast_to_fp8(torch.randn(g * m, k, dtype=torch.bfloat16), use_ue8m0=True,
                                       use_packed_ue8m0=True)
    a = (a[0].view(g, m, k), a[1].view(g, m, -1))
    d = torch.empty(g, m, n, dtype=torch.bfloat16)
    masked_m = torch.tensor([1, 16, 2, 9], dtype=torch.int32)
    mode = dg.get_print_paths()
    dg.set_print_paths(2)
    lines = []
    try:
        for _ in range(8):
            dg.clear_path_report()
            dg.m_grouped_fp8_fp4_gemm_nt_masked(a, w, d, masked_m, 8, recipe_a=(1, 128), recipe_b=(1, 32))
            lines += dg.get_path_report()
    finally:
        dg.set_print_paths(mode)
        dg.clear_path_report()
    assert lines and all(s.startswith('dg_m_grouped_fp8_fp4_gemm_nt_masked: ') for s in lines), lines

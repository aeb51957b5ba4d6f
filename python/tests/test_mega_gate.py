"""bf16_mega_gate and get_bf16_mega_gate_config as DeepGEMM 2.8's tests/test_mega_gate.py drives
them (its API contract and routing controls, on CPU tensors and smaller shapes), against a torch
statement of the gate written here; the fast path bitwise the reference backend; bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import deep_gemm_cpu as deep_gemm
from deep_gemm_cpu.testing import assert_bitwise_equal
from conftest import calc_diff

NUM_TOPK = 6
NUM_SHARED_EXPERTS = 1
ROUTED_SCALING_FACTOR = 1.5
NUM_EXTRA_EXPERTS = 32  # replicas of the first experts in the physical map (vLLM's EPLB layout)

# (num_routed_experts, num_shared_experts, num_topk), as DeepGEMM's test
GATE_CONFIGS = ((64, 2, 6), (72, 1, 6), (96, 2, 6), (108, 2, 6), (128, 2, 6), (144, 2, 6),
                (256, 1, 6), (256, 2, 8), (384, 1, 6), (384, 1, 9), (512, 1, 6))


def make_physical_map(num_logical):
    to_physical_map = torch.full((num_logical, NUM_EXTRA_EXPERTS + 1), -1, dtype=torch.int32)
    logical_count = torch.ones(num_logical, dtype=torch.int32)
    to_physical_map[:, 0] = torch.arange(num_logical, dtype=torch.int32)
    dup = min(num_logical, NUM_EXTRA_EXPERTS)
    to_physical_map[:dup, 1] = num_logical + torch.arange(dup, dtype=torch.int32)
    logical_count[:dup] = 2
    return to_physical_map, logical_count


def make_inputs(num_tokens, hidden, num_routed_experts, use_shared_as_routed=False, with_bias=True,
                with_image_bias=False, with_mask=False, with_physical_map=True,
                num_shared_experts=NUM_SHARED_EXPERTS):
    num_logical = num_routed_experts + (num_shared_experts if use_shared_as_routed else 0)
    mask = None
    if with_mask:
        mask = torch.rand(num_tokens) >= 0.25
        mask[0] = True
    to_physical_map, logical_count = make_physical_map(num_logical) if with_physical_map else (None, None)
    return dict(
        x=torch.randn(num_tokens, hidden, dtype=torch.bfloat16),
        weight=torch.randn(num_routed_experts, hidden, dtype=torch.bfloat16).mul_(hidden ** -0.5),
        mask=mask,
        bias=torch.randn(num_routed_experts) if with_bias else None,
        image_bias=torch.randn(num_routed_experts) if with_image_bias else None,
        image_token_mask=torch.rand(num_tokens) < 0.5 if with_image_bias else None,
        to_physical_map=to_physical_map,
        logical_count=logical_count,
    )


def make_outputs(inputs, use_shared_as_routed=False, with_unmapped_topk_idx=False, num_topk=NUM_TOPK,
                 num_shared_experts=NUM_SHARED_EXPERTS):
    shape = (inputs['x'].shape[0], num_topk + (num_shared_experts if use_shared_as_routed else 0))
    return dict(
        topk_idx=torch.empty(shape, dtype=torch.int64),
        topk_weights=torch.empty(shape, dtype=torch.float32),
        unmapped_topk_idx=torch.empty(shape[0], num_topk, dtype=torch.int64) if with_unmapped_topk_idx else None,
    )


def run_mega_gate(inputs, outputs, scoring_func, use_shared_as_routed=False, num_topk=NUM_TOPK,
                  num_shared_experts=NUM_SHARED_EXPERTS, **overrides):
    kwargs = {**inputs, **overrides}
    x, weight = kwargs.pop('x'), kwargs.pop('weight')
    unmapped_topk_idx = kwargs.pop('unmapped_topk_idx', outputs['unmapped_topk_idx'])
    return deep_gemm.bf16_mega_gate(
        x, weight, num_topk, use_shared_as_routed, num_shared_experts, ROUTED_SCALING_FACTOR, 0,
        scoring_func=scoring_func, unmapped_topk_idx=unmapped_topk_idx,
        out=(outputs['topk_idx'], outputs['topk_weights']), **kwargs)


def reference_logits(inputs):
    """Float32 logits, as DeepGEMM's test takes them from cuBLASLt (so the ranks tie where theirs do)."""
    return inputs['x'].float() @ inputs['weight'].float().t()


def apply_scoring(logits, scoring_func):
    return (torch.sigmoid(logits) if scoring_func == 'sigmoid' else
            F.softplus(logits).sqrt() if scoring_func == 'sqrtsoftplus' else logits)


def check_topk_weights(inputs, outputs, logits, scoring_func, mask=None, force_random=None,
                       fix_routing_mask=None, num_topk=NUM_TOPK):
    """DeepGEMM's checks: weights from the unbiased scores of the chosen experts, the choice up to
    numerical ties of score + bias, shared slots 1.0, masked tokens -1 / 0."""
    fused_idx, fused_weights = outputs['topk_idx'], outputs['topk_weights']
    num_tokens, num_routed_experts = logits.shape
    active = mask if mask is not None else torch.ones(num_tokens, dtype=torch.bool)
    score_based = active if force_random is None else active & ~force_random
    if score_based.any():
        scores = apply_scoring(logits, scoring_func)
        logical_topk_idx = outputs['unmapped_topk_idx']
        if logical_topk_idx is None:
            logical_topk_idx = fused_idx[:, :num_topk]
            to_physical_map = inputs['to_physical_map']
            if to_physical_map is not None:
                n = to_physical_map.shape[0]
                logical_topk_idx = torch.where(logical_topk_idx < n, logical_topk_idx, logical_topk_idx - n)
        selected_idx = logical_topk_idx[score_based]
        assert torch.all((selected_idx >= 0) & (selected_idx < num_routed_experts))

        ranking_bias = inputs['bias'] if inputs['bias'] is not None else torch.zeros(num_routed_experts)
        if inputs['image_token_mask'] is not None:
            ranking_bias = torch.where(inputs['image_token_mask'][:, None], inputs['image_bias'], ranking_bias)
        ranking = scores + ranking_bias

        def reference_weights(row_mask, topk_idx):
            topk_scores = scores[row_mask].gather(1, topk_idx)
            return topk_scores / (topk_scores.sum(dim=1, keepdim=True) + 1e-20) * ROUTED_SCALING_FACTOR

        weight_diff = calc_diff(fused_weights[score_based, :num_topk], reference_weights(score_based, selected_idx))
        assert weight_diff < 1e-11, weight_diff

        ranked = score_based if fix_routing_mask is None else score_based & ~fix_routing_mask
        if ranked.any():
            ranked_idx = logical_topk_idx[ranked]
            sorted_idx = ranked_idx.sort(dim=1).values
            assert torch.all(sorted_idx[:, 1:] != sorted_idx[:, :-1])
            selected_ranking = ranking[ranked].gather(1, ranked_idx)
            unselected_max = ranking[ranked].scatter(1, ranked_idx, float('-inf')).max(dim=1).values
            crossing = unselected_max - selected_ranking.min(dim=1).values
            tolerance = 1e-5 + 1e-5 * ranking[ranked].abs().amax(dim=1)
            assert torch.all(crossing <= tolerance), f'top-k beyond numerical ties: {crossing.max().item()}'
            # DeepGEMM's tie rule (the lower expert first): a stable descending sort
            best = ranking[ranked].sort(dim=1, descending=True, stable=True).indices[:, :num_topk]
            ref_weights = reference_weights(ranked, best)
            assert calc_diff(fused_weights[ranked, :num_topk].sort(dim=1).values,
                             ref_weights.sort(dim=1).values) < 1e-11
        if fused_weights.shape[1] > num_topk:
            assert torch.all(fused_weights[score_based, num_topk:] == 1.0)

    if (~active).any():
        assert torch.all(fused_idx[~active] == -1)
        assert torch.all(fused_weights[~active] == 0)
        if outputs['unmapped_topk_idx'] is not None:
            assert torch.all(outputs['unmapped_topk_idx'][~active] == -1)


def check_case(num_tokens, hidden, num_routed_experts, scoring_func='sqrtsoftplus', use_shared_as_routed=False,
               num_topk=NUM_TOPK, num_shared_experts=NUM_SHARED_EXPERTS, with_unmapped_topk_idx=False,
               **input_options):
    inputs = make_inputs(num_tokens, hidden, num_routed_experts, use_shared_as_routed,
                         num_shared_experts=num_shared_experts, **input_options)
    outputs = make_outputs(inputs, use_shared_as_routed, with_unmapped_topk_idx, num_topk, num_shared_experts)
    run_mega_gate(inputs, outputs, scoring_func, use_shared_as_routed, num_topk=num_topk,
                  num_shared_experts=num_shared_experts)
    check_topk_weights(inputs, outputs, reference_logits(inputs), scoring_func, inputs['mask'], num_topk=num_topk)
    return inputs, outputs


@pytest.mark.parametrize('num_routed_experts,num_shared_experts,num_topk', GATE_CONFIGS)
def test_gate_configs(num_routed_experts, num_shared_experts, num_topk):
    can_route_shared = (num_topk % num_shared_experts == 0 and
                        num_routed_experts % (num_topk // num_shared_experts) == 0)
    for use_shared_as_routed in ((False, True) if can_route_shared else (False,)):
        check_case(16, 1024, num_routed_experts, use_shared_as_routed=use_shared_as_routed, num_topk=num_topk,
                   num_shared_experts=num_shared_experts)


def test_scoring_and_options():
    check_case(16, 1024, 128, 'identity', with_bias=False, with_physical_map=False)
    check_case(129, 512, 260, 'sigmoid', with_image_bias=True, with_mask=True, with_unmapped_topk_idx=True)
    check_case(1, 7168, 256, 'sqrtsoftplus', num_topk=8)  # DeepSeek V3's router, one decode token
    inputs = make_inputs(128, 512, 384, with_image_bias=True)
    inputs['bias'].fill_(1e8)
    inputs['image_bias'].fill_(-1e8)
    outputs = make_outputs(inputs)
    run_mega_gate(inputs, outputs, 'sqrtsoftplus')
    check_topk_weights(inputs, outputs, reference_logits(inputs), 'sqrtsoftplus')


def test_routing_controls():
    torch.manual_seed(1)
    num_tokens, hidden, num_routed_experts = 512, 512, 384
    inputs = make_inputs(num_tokens, hidden, num_routed_experts, use_shared_as_routed=True, with_image_bias=True)
    outputs = make_outputs(inputs, use_shared_as_routed=True, with_unmapped_topk_idx=True)
    token_idx = torch.arange(num_tokens)
    mask, fix_routing_mask, force_random = token_idx % 11 != 0, token_idx % 3 == 0, token_idx % 5 == 0
    fixed_topk_idx = torch.randint(0, num_routed_experts, (num_tokens, NUM_TOPK), dtype=torch.int64)
    unmapped_topk_idx = outputs['unmapped_topk_idx']
    unmapped_topk_idx.copy_(fixed_topk_idx)
    fused_idx, fused_weights = run_mega_gate(inputs, outputs, 'sqrtsoftplus', True, mask=mask,
                                             fix_routing_mask=fix_routing_mask, force_random=force_random)
    check_topk_weights(inputs, outputs, reference_logits(inputs), 'sqrtsoftplus', mask, force_random,
                       fix_routing_mask)
    active_force_random = force_random & mask
    fixed = fix_routing_mask & mask & ~force_random
    assert torch.equal(unmapped_topk_idx[fixed], fixed_topk_idx[fixed])
    random_idx, random_weights = fused_idx[active_force_random], fused_weights[active_force_random]
    assert torch.all((random_idx >= 0) & (random_idx < inputs['logical_count'].sum()))
    assert torch.all(random_weights > 0)
    sorted_random_idx = random_idx.sort(dim=1).values
    assert torch.all(sorted_random_idx[:, 1:] != sorted_random_idx[:, :-1])
    assert torch.all(unmapped_topk_idx[active_force_random] == -1)
    # the physical replica: DeepGEMM's spread (ep_rank + token * 23333) % logical_count
    routed = mask & ~force_random
    to_physical_map, logical_count = inputs['to_physical_map'], inputs['logical_count']
    logical = torch.cat([unmapped_topk_idx, torch.full((num_tokens, 1), num_routed_experts)], dim=1)
    replica = (token_idx[:, None] * 23333) % (1 << 32) % logical_count[logical]
    assert torch.equal(fused_idx[routed], to_physical_map[logical, replica].long()[routed])


def test_ties_and_empty():
    num_topk = 8
    inputs = make_inputs(8, 256, 128, with_bias=False, with_physical_map=False)
    inputs['x'].zero_()
    inputs['weight'].zero_()
    topk_idx, _ = run_mega_gate(inputs, make_outputs(inputs, num_topk=num_topk), 'identity', num_topk=num_topk)
    assert torch.equal(topk_idx, torch.arange(num_topk, dtype=torch.int64).expand(8, -1))

    # unmapped_topk_idx as a strided view (rows of unit stride)
    inputs = make_inputs(16, 256, 128, with_physical_map=False)
    outputs = make_outputs(inputs, with_unmapped_topk_idx=True, num_topk=num_topk)
    outputs['unmapped_topk_idx'] = torch.empty(16, num_topk + 3, dtype=torch.int64)[:, :num_topk]
    run_mega_gate(inputs, outputs, 'sqrtsoftplus', num_topk=num_topk)
    check_topk_weights(inputs, outputs, reference_logits(inputs), 'sqrtsoftplus', num_topk=num_topk)

    inputs = make_inputs(32, 256, 128, with_physical_map=False)
    outputs = make_outputs(inputs, with_unmapped_topk_idx=True, num_topk=num_topk)
    topk_idx, topk_weights = run_mega_gate(inputs, outputs, 'sqrtsoftplus', num_topk=num_topk,
                                           force_random=torch.ones(32, dtype=torch.bool))
    assert torch.all((topk_idx >= 0) & (topk_idx < 128)) and torch.all(topk_weights > 0)
    sorted_idx = topk_idx.sort(dim=1).values
    assert torch.all(sorted_idx[:, 1:] != sorted_idx[:, :-1])
    assert torch.all(outputs['unmapped_topk_idx'] == -1)

    inputs = make_inputs(0, 256, 128, with_physical_map=False)
    topk_idx, topk_weights = run_mega_gate(inputs, make_outputs(inputs, num_topk=num_topk), 'sqrtsoftplus',
                                           num_topk=num_topk)
    assert topk_idx.shape == (0, num_topk) and topk_weights.shape == (0, num_topk)


def test_deterministic_repeat():
    inputs = make_inputs(16, 1024, 256)
    outputs = make_outputs(inputs, with_unmapped_topk_idx=True)
    deep_gemm.use_deterministic_algorithms(True)
    try:
        assert deep_gemm.get_bf16_mega_gate_config(16, 4096, 256, NUM_TOPK)['num_split_k'] == 1
        run_mega_gate(inputs, outputs, 'sqrtsoftplus')
        expected = {name: tensor.clone() for name, tensor in outputs.items()}
        for _ in range(100):
            run_mega_gate(inputs, outputs, 'sqrtsoftplus')
            for name, tensor in outputs.items():
                assert_bitwise_equal(tensor, expected[name], f'Deterministic invocation: {name}')
    finally:
        deep_gemm.use_deterministic_algorithms(False)


def test_fast_path_is_the_reference_bitwise():
    # Bitwise the reference where the engine's GEMM is (the portable and AVX2 levels: the header's
    # "Numerics"; AMX tiles and VDPBF16PS round their own way), then the same bits for any thread
    # count at the CPU's best level.
    inputs = make_inputs(70, 512, 260, with_image_bias=True, with_mask=True)
    old_backend, old_sms, old_isa = deep_gemm.get_backend(), deep_gemm.get_num_sms(), deep_gemm.get_isa()
    runs = (('reference', 1, old_isa), ('auto', 1, 'generic'), ('auto', 2, 'avx2'), ('auto', 3, 'avx2'),
            ('auto', 1, old_isa), ('auto', 2, old_isa), ('auto', 3, old_isa))
    results = []
    try:
        for backend, sms, isa in runs:
            deep_gemm.set_backend(backend)
            deep_gemm.set_num_sms(sms)
            deep_gemm.set_isa(isa)
            outputs = make_outputs(inputs, with_unmapped_topk_idx=True)
            results.append(run_mega_gate(inputs, outputs, 'sigmoid'))
    finally:
        deep_gemm.set_backend(old_backend)
        deep_gemm.set_num_sms(old_sms)
        deep_gemm.set_isa(old_isa)
    for idx, weights in results[1:4]:
        assert_bitwise_equal(idx, results[0][0])
        assert_bitwise_equal(weights, results[0][1])
    for idx, weights in results[5:]:
        assert_bitwise_equal(idx, results[4][0])
        assert_bitwise_equal(weights, results[4][1])
    # batch invariance: the last 3 tokens alone give the same weights (the replica depends on the token index)
    tail = {k: (v[-3:] if k in ('x', 'mask', 'image_token_mask') and v is not None else v) for k, v in inputs.items()}
    _, w_tail = run_mega_gate(tail, make_outputs(tail), 'sigmoid')
    assert_bitwise_equal(w_tail, results[4][1][-3:])


def test_returned_outputs_and_numpy():
    import ml_dtypes
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    w = torch.randn(24, 256, dtype=torch.bfloat16)
    idx, weights = deep_gemm.bf16_mega_gate(x, w, 4, True, 2, 2.0, 1, 'sigmoid')
    assert idx.shape == (5, 6) and idx.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.all(idx[:, 4:] == torch.tensor([24, 25])) and torch.all(weights[:, 4:] == 1.0)
    assert torch.allclose(weights[:, :4].sum(dim=1), torch.full((5,), 2.0))
    xn = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    wn = w.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    idx_np, w_np = deep_gemm.bf16_mega_gate(xn, wn, 4, True, 2, 2.0, 1, 'sigmoid', mask=np.ones(5, dtype=bool))
    assert isinstance(idx_np, np.ndarray)
    assert np.array_equal(idx_np, idx.numpy()) and np.array_equal(w_np, weights.numpy())
    cfg = deep_gemm.get_bf16_mega_gate_config(1, 7168, 256, 8)
    assert set(cfg) == {'block_tokens', 'num_mma_ctas', 'num_split_k', 'num_expert_groups',
                        'num_gate_warpgroups', 'num_sms'}


def test_bad_input():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    w = torch.randn(16, 256, dtype=torch.bfloat16)
    gate = deep_gemm.bf16_mega_gate
    with pytest.raises(TypeError, match="'x'"):
        gate(x.float(), w, 4, False, 1, 1.0, 0)
    with pytest.raises(ValueError, match='hidden'):
        gate(x[:, :128].contiguous(), w[:, :128].contiguous(), 4, False, 1, 1.0, 0)
    with pytest.raises(ValueError, match="'weight'"):
        gate(x, w[:14].contiguous(), 4, False, 1, 1.0, 0)
    with pytest.raises(ValueError, match="'num_topk'"):
        gate(x, w, 33, False, 1, 1.0, 0)
    with pytest.raises(ValueError, match="'ep_rank'"):
        gate(x, w, 4, False, 1, 1.0, -1)
    with pytest.raises(ValueError, match="'routed_scaling_factor'"):
        gate(x, w, 4, False, 1, float('inf'), 0)
    with pytest.raises(ValueError, match="'num_shared_experts'"):
        gate(x, w, 4, True, 3, 1.0, 0)
    with pytest.raises(ValueError, match="'scoring_func'"):
        gate(x, w, 4, False, 1, 1.0, 0, scoring_func='softmax')
    with pytest.raises(TypeError, match="'mask'"):
        gate(x, w, 4, False, 1, 1.0, 0, mask=torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="'mask'"):
        gate(x, w, 4, False, 1, 1.0, 0, mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="'bias'"):
        gate(x, w, 4, False, 1, 1.0, 0, bias=torch.ones(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="'image_bias'"):
        gate(x, w, 4, False, 1, 1.0, 0, image_bias=torch.ones(16))
    with pytest.raises(ValueError, match="'fix_routing_mask'"):
        gate(x, w, 4, False, 1, 1.0, 0, fix_routing_mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="'unmapped_topk_idx'"):
        gate(x, w, 4, False, 1, 1.0, 0, fix_routing_mask=torch.ones(4, dtype=torch.bool),
             unmapped_topk_idx=torch.full((4, 4), 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="'logical_count'"):
        gate(x, w, 4, False, 1, 1.0, 0, to_physical_map=torch.zeros(16, 2, dtype=torch.int32),
             logical_count=torch.full((16,), 3, dtype=torch.int32))
    out = (torch.full((4, 4), 7, dtype=torch.int64), torch.full((4, 5), 7.0))
    with pytest.raises(ValueError, match="'topk_weights'"):
        gate(x, w, 4, False, 1, 1.0, 0, out=out)
    assert torch.all(out[0] == 7)  # nothing written
    with pytest.raises(ValueError, match="'num_tokens'"):
        deep_gemm.get_bf16_mega_gate_config(0, 4096, 256, 6)
    with pytest.raises(ValueError, match="'hidden'"):
        deep_gemm.get_bf16_mega_gate_config(16, 100, 256, 6)

"""DeepSeek-style Mega MoE code under the launchers people use: mpirun with an mpi4py communicator
(shared memory, and the MPI network path forced with DG_COMM_FORCE_NETWORK=1) and torchrun with a
gloo group, on 1, 2 and 4 ranks. Each run must give bitwise the y and the recv stats of the same
problem in one process (test_mega_fused checks that one against the reference and the rank
counts against each other). CI installs Open MPI and mpi4py; elsewhere a missing launcher skips."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import deep_gemm_cpu as dg
from test_mega_fused import E, H, I, K, N, TMAX, _problem

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mega_rank_script.py')


def _need(ok, what):
    if not ok:
        if os.environ.get('CI'):
            pytest.fail(f'{what} is missing on a CI machine (.ci/run installs it)')
        pytest.skip(f'{what} is not installed')


def _one_process():
    x, topk_idx, topk_weights, l1, l2 = _problem('fp8xfp4')
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I)
    buf.x[:N].copy_(x[0])
    buf.x_sf[:N].copy_(x[1])
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    stats = torch.zeros(E, dtype=torch.int32)
    dg.fp8_fp4_mega_moe(y, l1, l2, buf, cumulative_local_expert_recv_stats=stats, activation_clamp=10.0)
    return y, stats


def _check(out_dir, R, path_word):
    y_one, stats_one = _one_process()
    res = [torch.load(os.path.join(out_dir, f'rank{r}.pt')) for r in range(R)]
    assert torch.equal(torch.cat([r['y'] for r in res]), y_one)
    assert torch.equal(torch.cat([r['stats'] for r in res]), stats_one)
    for r in res:
        assert any(path_word in line for line in r['paths']), r['paths']


def _env(**extra):
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS='1', **extra)
    return env


def _mpirun():
    """mpirun (or mpiexec) where mpi4py and the library's MPI build are there too; else skips
    (fails on CI)."""
    mpirun = shutil.which('mpirun') or shutil.which('mpiexec')
    try:
        import mpi4py  # noqa: F401
        have = mpirun is not None
    except ImportError:
        have = False
    _need(have, 'mpirun with mpi4py')
    _need(dg._C.has_mpi(), 'the library\'s MPI build')
    return mpirun


@pytest.mark.parametrize('R,net', [(2, 0), (4, 1)])
def test_mpirun_mpi4py(R, net):
    mpirun = _mpirun()
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([mpirun, '--allow-run-as-root', '--oversubscribe', '-n', str(R), sys.executable, SCRIPT,
                              'mpi', d], env=_env(DG_COMM_FORCE_NETWORK=str(net)), capture_output=True, text=True,
                             timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
        _check(d, R, 'network path' if net else 'shared memory')


@pytest.mark.parametrize('R', [2])
def test_torchrun_gloo(R):
    torchrun = shutil.which('torchrun')
    _need(torchrun is not None, 'torchrun')
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([torchrun, '--standalone', f'--nproc-per-node={R}', SCRIPT, 'torch', d], env=_env(),
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
        _check(d, R, 'shared memory')


def test_example_script():
    """examples/mega_moe.py (linked from the README) runs as written."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.join(root, 'examples', 'mega_moe.py'), '--ranks', '2', '--tokens',
                          '8'], env=_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count('calc_diff against the reference') == 2, out.stdout

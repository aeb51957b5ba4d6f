"""python -m deep_gemm_cpu.mega_bench stays runnable: its quickest setting (--quick) with 1 and 2
rank processes in a subprocess exits 0 and prints the header, one row per token count and rank
(plus the "all" row) with the fused output within calc_diff 1e-3 of the unfused chain, and a
JSON of the same figures; --full refuses clearly when the weights would not fit; under mpirun
(--mpi) with the forced network path (--network) the same, with the fused call's path report
naming the MPI network path."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import deep_gemm_cpu as dg
from deep_gemm_cpu import mega_bench

QUICK_TOKENS = mega_bench.CONFIGS['quick']['tokens']
ROW = re.compile(r'^\s*(\d+)\s+(\d+|all)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)'
                 r'\s+([\d.]+)\s+([\d.]+)x\s+(\S+)')


def _run(args, timeout=120, launcher=()):
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(dg.__file__)))
    env['PYTHONPATH'] = os.pathsep.join([pkg_root] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    return subprocess.run(list(launcher) + [sys.executable, '-m', 'deep_gemm_cpu.mega_bench'] + args,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _mpirun(ranks):
    """The mpirun command line for `ranks` processes (Open MPI's flags for root and for more
    ranks than cores where it is Open MPI's), with mpi4py and the library's MPI build; else
    skips (fails on CI, where .ci/run installs them)."""
    mpirun = shutil.which('mpirun') or shutil.which('mpiexec')
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpirun = None
    if mpirun is None or not dg._C.has_mpi():
        if os.environ.get('CI'):
            pytest.fail('mpirun, mpi4py or the library\'s MPI build is missing on a CI machine')
        pytest.skip('mpirun, mpi4py or the library\'s MPI build is not installed')
    version = subprocess.run([mpirun, '--version'], capture_output=True, text=True).stdout
    flags = ['--allow-run-as-root', '--oversubscribe'] if 'Open MPI' in version or 'OpenRTE' in version else []
    return [mpirun] + flags + ['-n', str(ranks)]


@pytest.mark.parametrize('ranks,mpi', [(1, False), (2, False), (2, True)])
def test_quick_run(ranks, mpi, tmp_path):
    out = tmp_path / 'mega.json'
    args = ['--quick', '--limits', 'python', '--reps', '1', '--json', str(out)]
    if mpi:  # the ranks started by mpirun, the fused call on the forced MPI network path
        r = _run(args + ['--mpi', '--network'], timeout=180, launcher=_mpirun(ranks))
    else:
        r = _run(args + ['--ranks', str(ranks)])
    assert r.returncode == 0, f'exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}'
    text = r.stdout
    if mpi:
        assert re.search(r'^path \(rank 0\): dg_fp8_fp4_mega_moe\S*: network path \(MPI\), 2 ranks', text, re.M), text
        threads = int(re.search(r'ranks 2 x (\d+) threads per rank', text).group(1))  # mpirun's binding decides
    else:
        assert re.search(r'^path \(rank 0\): dg_fp8_fp4_mega_moe\S*: symmetric buffer over shared memory', text,
                         re.M), text
        threads = max(1, len(os.sched_getaffinity(0)) // ranks)
    assert f'ranks {ranks} x {threads} threads per rank' in text, text
    assert mega_bench.cpu_name() in text.splitlines()[0] and 'limits: fp32' in text, text
    assert re.search(r'^\s*tokens\s+rank\s+pairs\s+experts\s+fused ms\s+TFLOPS\s+limit\s+%lim\s+comm GB/s\s+'
                     r'tokens/s\s+unfused ms\s+fused/unf\s+calc_diff', text, re.M), text
    rows = [m.groups() for m in map(ROW.match, text.splitlines()) if m]
    seen = {(int(g[0]), g[1]) for g in rows}
    want = {(t, str(k)) for t in QUICK_TOKENS for k in list(range(ranks)) + ['all']}
    assert seen == want, f'{seen} != {want}\n{text}'
    for g in rows:
        assert float(g[4]) > 0 and float(g[11]) > 0, g
        assert float(g[12]) <= 1e-3, g
    assert 'FUSED OUTPUT WRONG' not in text and 'run took' in text

    res = json.loads(out.read_text())
    assert res['ranks'] == ranks and res['threads_per_rank'] == threads and not res['failed']
    assert res['limits']['fp32_gflops'] > 0 and res['limits']['dram_gbps'] > 0
    assert [e['tokens'] for e in res['results']] == list(QUICK_TOKENS)
    K = res['config']['topk']
    for e in res['results']:
        figs = e['ranks']
        assert [f['rank'] for f in figs] == list(range(ranks))
        # every (token, slot) pair of every rank lands on exactly one rank's experts
        assert sum(f['pairs'] for f in figs) == e['all']['pairs'] == ranks * e['tokens'] * K
        for f in figs:
            assert f['recv_stats_ok'] and f['finite'] and f['calc_diff'] <= 1e-3
            assert f['fused_s'] > 0 and f['unfused_s'] > 0 and f['tflops'] > 0


@pytest.mark.parametrize('args,message', [(['--experts', '3'], 'do not split over 2 ranks'),
                                          (['--ranks', '3'], 'mpirun started 2 processes'),
                                          (['--limits', '/nonexistent.json'], 'nonexistent')])
def test_mpi_refusals_end_every_rank(args, message):
    """Under mpirun, a refusal or an error on rank 0 before the run ends every rank (no hang)."""
    r = _run(['--quick', '--mpi'] + args, timeout=120, launcher=_mpirun(2))
    assert r.returncode != 0 and message in r.stdout + r.stderr, r.stdout + r.stderr


def test_network_needs_mpi():
    r = _run(['--quick', '--network'], timeout=60)
    assert r.returncode == 2 and '--network needs --mpi' in r.stderr, r.stdout + r.stderr


def test_full_refused_when_too_large():
    """BF16 weights of 384 experts of hidden 7168 are about 47 GiB: refused before spawning."""
    avail = mega_bench.mem_available()
    cfg = mega_bench.CONFIGS['full']
    if avail is None or mega_bench.memory_plan(cfg, 'bf16xbf16', 1, cfg['tokens'])[1] <= 0.9 * avail:
        pytest.skip('this machine has the memory for the BF16 reference configuration')
    r = _run(['--full', '--mma', 'bf16xbf16', '--ranks', '1'], timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'MemAvailable' in r.stderr and 'not run' in r.stderr, r.stderr

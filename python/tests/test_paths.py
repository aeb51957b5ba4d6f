"""The path report from Python: set_print_paths / get_path_report / clear_path_report."""
import subprocess
import sys

import pytest
import torch

import deep_gemm_cpu as dg


@pytest.fixture
def recording():
    mode = dg.get_print_paths()
    dg.set_print_paths(2)
    dg.clear_path_report()
    yield
    dg.clear_path_report()
    dg.set_print_paths(mode)


def test_report_lines(recording):
    a = torch.randn(1, 256).bfloat16()
    b = torch.randn(64, 256).bfloat16()
    d = torch.empty(1, 64, dtype=torch.bfloat16)
    for _ in range(3):
        dg.bf16_gemm_nt(a, b, d)
    lines = dg.get_path_report()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dg_bf16_gemm_nt: ") and "| first: m=1 n=64 k=256" in lines[0], lines
    dg.clear_path_report()
    assert dg.get_path_report() == []


def test_reference_backend_is_reported(recording):
    a, b = torch.randn(3, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    d = torch.empty(3, 8, dtype=torch.bfloat16)
    dg.set_backend("reference")
    try:
        dg.bf16_gemm_nt(a, b, d)
    finally:
        dg.set_backend("auto")
    assert any("reference (the reference backend is selected)" in s for s in dg.get_path_report())


def test_bad_mode():
    with pytest.raises(ValueError, match="'mode'"):
        dg.set_print_paths(3)
    with pytest.raises(TypeError):
        dg.set_print_paths("yes")


def test_env_prints_to_stderr():
    code = ("import torch, deep_gemm_cpu as dg\n"
            "a = torch.randn(2, 128).bfloat16(); b = torch.randn(32, 128).bfloat16()\n"
            "d = torch.empty(2, 32, dtype=torch.bfloat16)\n"
            "dg.bf16_gemm_nt(a, b, d); dg.bf16_gemm_nt(a, b, d)\n")
    import os
    env = dict(os.environ, DG_PRINT_PATHS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [s for s in out.stderr.splitlines() if s.startswith("[deepgemm path] ")]
    assert len(lines) == 1 and "dg_bf16_gemm_nt: " in lines[0], out.stderr

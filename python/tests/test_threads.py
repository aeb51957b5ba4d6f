"""Kernels run without the GIL: another Python thread keeps running during a long call."""
import threading
import time

import torch

import deep_gemm_cpu as dg


def test_gil_released_during_kernel():
    a = torch.randn(128, 1024, dtype=torch.bfloat16)
    b = torch.randn(512, 1024, dtype=torch.bfloat16)
    d = torch.empty(128, 512)
    old = dg.get_backend()
    dg.set_backend('reference')  # slow on purpose: a call of a few hundred ms
    started = threading.Event()

    def work():
        started.set()
        for _ in range(1):
            dg.bf16_gemm_nt(a, b, d)

    try:
        t = threading.Thread(target=work)
        t.start()
        started.wait()
        time.sleep(0.02)
        first = time.perf_counter()
        while t.is_alive():
            pass
        ran_alongside = time.perf_counter() - first
        t.join()
    finally:
        dg.set_backend(old)
    # With the GIL held by the kernel this thread could only resume after the calls returned.
    assert ran_alongside > 0.05, ran_alongside
    assert torch.allclose(d, a.float() @ b.float().t(), rtol=1e-4, atol=1e-3)

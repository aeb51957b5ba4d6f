"""deep_gemm.testing on CPU: calc_diff, count_bytes and wall-clock benchmark helpers with
DeepGEMM's signatures (bench, bench_kineto), DeepGEMM 2.8's test helpers (get_arch_major,
test_filter, ignore_env, assert_bitwise_equal), so DeepGEMM-style tests port unchanged."""
import functools
import os
import sys
import time
from typing import Callable

from ._C import calc_diff as _calc_diff


def calc_diff(x, y):
    """DeepGEMM's 1 - 2 sum(xy) / sum(x^2 + y^2) in double (0 when both are all zero)."""
    try:
        return _calc_diff(x, y)
    except TypeError:
        # Other dtypes (e.g. float64): compute as DeepGEMM does, in double.
        x, y = x.double(), y.double()
        denominator = (x * x + y * y).sum()
        if denominator == 0:
            return 0.0
        return float(1 - 2 * (x * y).sum() / denominator)


def count_bytes(*tensors):
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            if hasattr(t, 'element_size'):
                total += t.numel() * t.element_size()
            else:
                total += t.nbytes
    return total


def bench(fn, num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False):
    """Average seconds per call of fn() (wall clock, after num_warmups calls)."""
    for _ in range(num_warmups):
        fn()
    start = time.perf_counter()
    for _ in range(num_tests):
        fn()
    return (time.perf_counter() - start) / num_tests


def bench_kineto(fn, kernel_names, num_tests: int = 30, suppress_kineto_output: bool = False,
                 trace_path=None, flush_l2: bool = True, with_multiple_kernels: bool = False):
    """DeepGEMM's profiler-based timer, measured on the CPU by wall clock: seconds per call of
    fn(), returned once per kernel name (a tuple when kernel_names is a tuple)."""
    t = bench(fn, num_warmups=1, num_tests=num_tests)
    return tuple(t for _ in kernel_names) if isinstance(kernel_names, tuple) else t


class empty_suppress:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        pass


class suppress_stdout_stderr:
    def __enter__(self):
        self._null = open(os.devnull, 'w')
        self._saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._null.fileno(), 1)
        os.dup2(self._null.fileno(), 2)
        return self

    def __exit__(self, *_):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        os.close(self._saved[0])
        os.close(self._saved[1])
        self._null.close()


def assert_bitwise_equal(x, y, label: str = ''):
    """DeepGEMM 2.8's check that two tensors hold the same bits (NaN payloads and signed zeros
    included): same shape, same dtype, equal bytes. torch tensors or NumPy arrays."""
    suffix = f' ({label})' if label else ''
    assert tuple(x.shape) == tuple(y.shape), f'shape mismatch{suffix}: {tuple(x.shape)} vs {tuple(y.shape)}'
    assert x.dtype == y.dtype, f'dtype mismatch{suffix}: {x.dtype} vs {y.dtype}'
    if hasattr(x, 'element_size'):
        import torch
        xb = x.detach().contiguous().reshape(-1).view(torch.uint8)
        yb = y.detach().contiguous().reshape(-1).view(torch.uint8)
        differ = int((xb != yb).sum())
    else:
        import numpy as np
        xb = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        yb = np.ascontiguousarray(y).reshape(-1).view(np.uint8)
        differ = int((xb != yb).sum())
    if differ:
        raise AssertionError(f'bitwise mismatch{suffix}: {differ} bytes differ')


# The architecture DeepGEMM code should branch on when it runs here.
CPU_ARCH_MAJOR = 10


def get_arch_major() -> int:
    """DeepGEMM's `torch.cuda.get_device_capability()[0]`; a CPU run answers 10 (SM100).

    DeepGEMM's code and tests branch on this value, and 10 is their full path: UE8M0 (packed)
    scales with 1D1D kernels, FP4 operands (FP8 x FP4, FP4 x FP4, the FP4 indexer), psum layouts,
    MN-major operands and BF16 accumulation for FP8, every indexer head count and block size.
    This library implements all of that on every CPU. 9 (SM90) would select Hopper's narrower
    path (float32 1D2D scales only, K-major FP8, no FP4) and 12 (SM120) a consumer-GPU one, so
    10 is the value that runs DeepSeek's code in its general form, including the `alpha=`
    epilogue of the dense GEMMs that DeepGEMM 2.8's tests pass on 10.
    """
    return CPU_ARCH_MAJOR


def test_filter(condition: Callable):
    """Decorator: run the function only when condition() is true; otherwise print that it was
    filtered (DeepGEMM's helper, e.g. @test_filter(lambda: get_arch_major() >= 10))."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if condition():
                return func(*args, **kwargs)
            print(f'{func.__name__}:')
            print(f' > Filtered by {condition}')
            print()
        return wrapper
    return decorator


test_filter.__test__ = False  # not a pytest test


def ignore_env(name: str, condition: Callable):
    """Decorator: when condition() is true, run the function with environment variable `name`
    removed, and put it back afterwards (also when the function raises)."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved
        return wrapper
    return decorator

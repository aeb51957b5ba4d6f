"""deep_gemm.testing on CPU: calc_diff, count_bytes and wall-clock benchmark helpers with
DeepGEMM's signatures (bench, bench_kineto), so DeepGEMM-style tests port unchanged."""
import os
import sys
import time

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
    import torch
    assert x.shape == y.shape, f'shape mismatch {label}: {x.shape} vs {y.shape}'
    assert x.dtype == y.dtype, f'dtype mismatch {label}: {x.dtype} vs {y.dtype}'
    xb, yb = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
    if not torch.equal(xb, yb):
        n = int((xb != yb).sum())
        raise AssertionError(f'bitwise mismatch{f" ({label})" if label else ""}: {n} bytes differ')

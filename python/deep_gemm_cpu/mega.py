"""DeepGEMM's Mega MoE API on CPU processes.

Each rank is a process; its SymmBuffer is a shared-memory segment that every rank of the machine
maps (the C library's dg_symm_buffer, include/deepgemm.h section mega-moe). `group` is a
torch.distributed process group (gloo, what CPU serving stacks use; `deep_gemm_cpu.utils.dist.
init_dist` makes one), an mpi4py communicator, or None for a single process. The group is used
only to create the buffer (agree on a name, check the configuration, barriers between the three
creation steps); the fused calls synchronise through the segments themselves, so they need no
collective of the group and work the same under torchrun, torch.multiprocessing.spawn or mpirun.

fp8_fp4_mega_moe / bf16_mega_moe compute bitwise the unfused chain (dispatch, m-grouped GEMM,
SwiGLU + FP8 cast, m-grouped GEMM, combine) for any number of ranks and threads; failures
(invalid arguments on any rank, topk_idx out of range, a rank that exits or stops calling:
DG_COMM_TIMEOUT seconds, default 60) raise on every rank instead of hanging.
"""
import ctypes
import math
import os
import secrets
import socket
import types
import warnings
from typing import Optional, Tuple, Union

import torch

from . import _C
from .utils import align

_DTYPES = {'float8_e4m3fn': torch.float8_e4m3fn, 'bfloat16': torch.bfloat16, 'int32': torch.int32,
           'int64': torch.int64, 'float32': torch.float32, 'uint8': torch.uint8}


class _Bootstrap:
    """rank / size / allgather / barrier over what the caller passed as `group`."""

    def __init__(self, group):
        self.group = group
        if group is None:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                self.kind, self.group = 'torch', dist.group.WORLD
            else:
                self.kind = 'single'
        elif hasattr(group, 'Get_rank') and hasattr(group, 'allgather'):
            self.kind = 'mpi4py'
        elif hasattr(group, 'rank') and hasattr(group, 'size'):
            self.kind = 'torch'
        else:
            raise TypeError(f'group must be a torch.distributed ProcessGroup, an mpi4py communicator or None, '
                            f'got {type(group).__name__}')

    def rank(self) -> int:
        return {'single': lambda: 0, 'mpi4py': lambda: self.group.Get_rank(),
                'torch': lambda: self.group.rank()}[self.kind]()

    def size(self) -> int:
        return {'single': lambda: 1, 'mpi4py': lambda: self.group.Get_size(),
                'torch': lambda: self.group.size()}[self.kind]()

    def allgather(self, obj) -> list:
        if self.kind == 'single':
            return [obj]
        if self.kind == 'mpi4py':
            return self.group.allgather(obj)
        import torch.distributed as dist
        out = [None] * self.size()
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.kind == 'mpi4py':
            self.group.Barrier()
        elif self.kind == 'torch':
            import torch.distributed as dist
            dist.barrier(group=self.group)

    def collective(self, fn):
        """Runs fn() on every rank; if it raised on any rank, raises on every rank."""
        try:
            result, failure = fn(), None
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            result, failure = None, e
        failures = self.allgather(None if failure is None else f'{type(failure).__name__}: {failure}')
        if failure is not None:
            raise failure
        for r, f in enumerate(failures):
            if f is not None:
                raise RuntimeError(f'rank {r} failed to create the symmetric buffer: {f}')
        return result


def _same_mpi(comm) -> bool:
    """A communicator may pass from mpi4py to the library only when both use the same MPI
    library (the handle's type and meaning differ between MPIs)."""
    try:
        from mpi4py import MPI
        return MPI.Get_library_version().strip('\x00 \n') == _C.mpi_library_version().strip('\x00 \n')
    except Exception:  # noqa: BLE001 - no usable mpi4py: the Python bootstrap serves
        return False


def _machine_id() -> str:
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}'


def _tensor_over(handle, field: str) -> torch.Tensor:
    """A tensor over one area of this rank's segment; it keeps the handle (and the mapping)
    alive for as long as it exists."""
    address, rows, cols, dtype_name = _C.symm_buffer_view(handle, field)
    dtype = _DTYPES[dtype_name]
    nbytes = rows * cols * dtype.itemsize
    if nbytes == 0:
        return torch.empty((rows, cols), dtype=dtype)
    area_type = type('_SymmArea', (ctypes.c_char * nbytes,), {})
    area = area_type.from_address(address)
    area._handle = handle
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return torch.frombuffer(area, dtype=torch.uint8).view(dtype).view(rows, cols)


class SymmBuffer:
    """One rank's symmetric buffer. Views: x, x_sf (fp8xfp4, fp8xfp8), topk_idx, topk_weights, each with
    num_max_tokens_per_rank rows; the intermediate-activation views of DeepGEMM's GPU buffer
    (l1_acts, shared_l2_acts, ...) are None: the CPU kernel keeps those in its own waves
    (shared_l1_acts_sf is a placeholder, see _adopt)."""

    def __init__(self, group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, num_shared_experts: int = 0, mma_type: str = 'fp8xfp4',
                 activation: str = 'swiglu', base: Optional['SymmBuffer'] = None):
        _check_activation('SymmBuffer', mma_type, activation)
        boot = _Bootstrap(group)
        self.group = boot.group
        self.num_ranks, self.rank = boot.size(), boot.rank()
        self.num_experts, self.num_topk = num_experts, num_topk
        self.num_max_tokens_per_rank = align(num_max_tokens_per_rank, self._token_alignment())
        self.hidden, self.intermediate_hidden = hidden, intermediate_hidden
        self.num_shared_experts, self.mma_type, self.activation = num_shared_experts, mma_type, activation
        config = (num_experts, self.num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                  num_shared_experts, mma_type)

        if base is not None:
            if base._handle is None or base.group is not self.group or base._config != config:
                raise ValueError('a CPU symmetric buffer can only be reused (base=) by the same group with the '
                                 'same configuration; create a new one instead')
            self._adopt(base._handle, config)
            return

        if boot.kind == 'mpi4py' and _C.has_mpi() and _same_mpi(group):
            # The library's own MPI bootstrap: shared memory on one machine, the network path
            # across machines (or with DG_COMM_FORCE_NETWORK=1).
            from mpi4py import MPI
            self._adopt(_C.symm_buffer_create_mpi(MPI._addressof(group), num_experts, self.num_max_tokens_per_rank,
                                                  num_topk, hidden, intermediate_hidden, num_shared_experts,
                                                  mma_type), config)
            return

        # Agree on one name and check that every rank runs on this machine with this configuration.
        mine = (_machine_id(), config, f'{os.getpid()}-{secrets.token_hex(6)}')
        everyone = boot.allgather(mine)
        name = everyone[0][2]
        for r, (machine, cfg, _) in enumerate(everyone):
            if cfg != config:
                raise ValueError(f'the ranks passed different configurations: rank {r} has {cfg}, '
                                 f'rank {self.rank} has {config} (num_experts, num_max_tokens_per_rank, num_topk, '
                                 f'hidden, intermediate_hidden, num_shared_experts, mma_type)')
            if machine != mine[0]:
                raise NotImplementedError(
                    f'rank {r} runs on another machine ({machine.split("/")[0]}): over a torch.distributed '
                    f'group the CPU mega MoE exchanges tokens through shared memory between ranks of one '
                    f'machine; across machines pass an mpi4py communicator (the MPI network path)')

        handle = boot.collective(lambda: _C.symm_buffer_create(
            self.num_ranks, self.rank, num_experts, self.num_max_tokens_per_rank, num_topk, hidden,
            intermediate_hidden, num_shared_experts, mma_type, name))
        boot.barrier()
        boot.collective(lambda: _C.symm_buffer_attach(handle))
        boot.barrier()
        _C.symm_buffer_seal(handle)
        self._adopt(handle, config)

    @staticmethod
    def _token_alignment() -> int:
        return _C.get_token_alignment_for_mega_moe()

    def _adopt(self, handle, config):
        self._handle, self._config = handle, config
        fp8 = self.mma_type != 'bf16xbf16'
        self.x = _tensor_over(handle, 'x')
        self.x_sf = _tensor_over(handle, 'x_sf') if fp8 else None
        self.topk_idx = _tensor_over(handle, 'topk_idx')
        self.topk_weights = _tensor_over(handle, 'topk_weights')
        self.buffer = self.x  # DeepGEMM's raw buffer tensor; here the first area of the segment
        self.handle = types.SimpleNamespace(buffer_ptrs=[self.x.data_ptr()])
        (self.shared_l1_acts, self.shared_l2_acts, self.shared_l2_acts_sf,
         self.l1_acts, self.l1_acts_sf, self.l2_acts, self.l2_acts_sf) = (None,) * 7
        # DeepGEMM's kernel reads the shared expert's input scales from a copy in its own layout,
        # which callers fill (tests/test_mega_moe.py); the CPU kernel reads x_sf, so this is a
        # placeholder of that shape that the kernel ignores.
        self.shared_l1_acts_sf = (torch.zeros((align(self.num_max_tokens_per_rank, 128), self.x_sf.shape[1]),
                                              dtype=torch.int32)
                                  if self.mma_type in ('fp8xfp4', 'fp8xfp8') and self.num_shared_experts > 0
                                  else None)

    def destroy(self):
        """Calls on this buffer raise afterwards. The memory is released once no view of it
        (buffer.x, ...) remains."""
        if self._handle is not None:
            _C.symm_buffer_destroy(self._handle)
        self._handle = None
        self.handle = self.buffer = self.group = None
        self.x = self.x_sf = self.topk_idx = self.topk_weights = None


def get_symm_buffer_for_mega_moe(group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                                 hidden: int, intermediate_hidden: int, num_shared_experts: int = 0,
                                 use_fp8_dispatch: Union[bool, None] = None, mma_type: str = 'fp8xfp4',
                                 activation: str = 'swiglu') -> SymmBuffer:
    if mma_type == 'sm90_fp8':
        raise ValueError("the SM90 FP8 mega MoE's buffer comes from get_symm_buffer_for_sm90_mega_moe")
    if use_fp8_dispatch is not None:
        if use_fp8_dispatch != (mma_type.split('x')[0] == 'fp8'):
            raise ValueError(f'use_fp8_dispatch={use_fp8_dispatch} contradicts mma_type={mma_type!r}')
        warnings.warn('`use_fp8_dispatch` will be deprecated in the future, please use `mma_type`',
                      DeprecationWarning, stacklevel=2)
    return SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                      num_shared_experts, mma_type=mma_type, activation=activation)


def get_token_alignment_for_mega_moe() -> int:
    return _C.get_token_alignment_for_mega_moe()


def get_block_m_for_mega_moe(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_tokens: int,
                             num_topk: int, mma_type: str = 'fp8xfp4') -> int:
    """DeepGEMM's M block of the fused kernel. The CPU kernel blocks M inside its GEMMs; this is
    the token alignment, which is what callers use it for (padding scale-factor layouts)."""
    return _C.get_token_alignment_for_mega_moe()


def get_symm_buffer_size_for_mega_moe(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int,
                                      num_topk: int, hidden: int, intermediate_hidden: int,
                                      mma_type: str = 'fp8xfp4', activation: str = 'swiglu',
                                      num_shared_experts: int = 0):
    """(bytes of one rank's segment, None): DeepGEMM returns a slicing function as the second
    element, which only its own SymmBuffer uses."""
    _check_activation('get_symm_buffer_size_for_mega_moe', mma_type, activation)
    tokens = align(num_max_tokens_per_rank, _C.get_token_alignment_for_mega_moe())
    return _C.symm_buffer_size(num_ranks, num_experts, tokens, num_topk, hidden, intermediate_hidden,
                               num_shared_experts, mma_type), None


class TransformedWeights(tuple):
    """What transform_weights_for_mega_moe returns for FP8 / FP4 weights: the (weights, scales)
    pair DeepGEMM returns (copies in the CPU kernel's layout, which is the input's), carrying
    `.packed`, the same weights packed once for this ISA level (a PackedB, pack_b with recipe
    (1, 1, 32)), which the mega MoE calls run on."""

    packed = None


def _packed_of(w):
    """The PackedB that transform_weights_for_mega_moe attached to w, when it can serve a call
    now (not freed, packed for the current ISA, not the reference backend); else None."""
    p = getattr(w, 'packed', None) if isinstance(w, TransformedWeights) else getattr(w, '_dg_packed', None)
    if p is None or p.freed or p.isa != _C.get_isa() or _C.get_backend() == 'reference':
        return None
    return p


def transform_weights_for_mega_moe(l1_weights, l2_weights, activation: str = 'swiglu', pack: bool = True):
    """DeepGEMM prepares the weights once for its kernel (gate/up interleaved, scales transposed
    for the tensor memory); the CPU kernel's prepared form is its pre-packed weights. Returns
    (l1, l2) as DeepGEMM does: for FP8 / FP4 (weights, scales) pairs, TransformedWeights pairs
    (copies of the inputs, in the input's layout); for BF16 tensors, tensor copies. With
    pack=True (the default) each also carries its weights packed once for the current ISA level
    (pack_b: the routed [E/R, N, K] experts as grouped weights, the shared [N, K] dense), and
    the mega MoE calls run on those: no weight packing per call, and decode steps that read each
    active expert's FP4 weights once. The packed form takes about 3 bytes per weight (FP4: 6x
    the FP4 bytes; see pack_b); pack=False keeps only the copies. Results are bitwise the same
    either way; a call under another ISA level (set_isa) or the reference backend runs on the
    copies."""
    if activation not in ('swiglu', 'situ'):
        raise ValueError(f"transform_weights_for_mega_moe: activation must be 'swiglu' or 'situ', got {activation!r}")
    if activation == 'situ' and not (isinstance(l1_weights, (tuple, list)) and isinstance(l2_weights, (tuple, list))):
        raise ValueError("transform_weights_for_mega_moe: 'situ' needs FP8 x FP4 (weights, scales) pairs for L1 and L2")

    def transform(w, name):
        if isinstance(w, (tuple, list)):
            if len(w) != 2 or not all(isinstance(t, torch.Tensor) for t in w):
                raise TypeError(f'transform_weights_for_mega_moe: {name} must be a (weights, scales) pair of tensors')
            out = TransformedWeights(t.clone() for t in w)
            if pack and _is_nvfp4_pair(w):  # NVFP4: the E4M3 scale values as float32, per 1x16
                values = w[1].contiguous().view(torch.uint8).view(torch.float8_e4m3fn).float()
                out.packed = _C.pack_b((out[0], values), recipe=(1, 1, 16))
            elif pack:
                out.packed = _C.pack_b(tuple(out), recipe=(1, 1, 32))
            return out
        if isinstance(w, torch.Tensor):
            out = w.clone()
            if pack:
                out._dg_packed = _C.pack_b(out)
            return out
        raise TypeError(f'transform_weights_for_mega_moe: {name} must be a tensor or a (tensor, scales) tuple, '
                        f'got {type(w).__name__}')
    return transform(l1_weights, 'l1_weights'), transform(l2_weights, 'l2_weights')


def _situ_args(activation, activation_clamp, situ_beta, situ_linear_beta):
    """The binding's SiTU keywords, with DeepGEMM's rules: 'situ' takes both betas (finite, > 0)
    and no activation_clamp; 'swiglu' takes no betas."""
    if activation != 'situ':
        if situ_beta is not None or situ_linear_beta is not None:
            raise ValueError("fp8_fp4_mega_moe: situ_beta / situ_linear_beta apply to activation='situ' only")
        return {}
    if activation_clamp is not None:
        raise ValueError("fp8_fp4_mega_moe: activation='situ' takes no activation_clamp")
    if situ_beta is None or situ_linear_beta is None:
        raise ValueError("fp8_fp4_mega_moe: activation='situ' needs situ_beta and situ_linear_beta")
    betas = dict(situ_beta=float(situ_beta), situ_linear_beta=float(situ_linear_beta))
    for name, v in betas.items():
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f'fp8_fp4_mega_moe: {name} must be finite and > 0, got {v}')
    return betas


def _run_packed(fp8, y, weights, sym_buffer, stats, clamp, situ=None):
    """The `_packed` call when every given weight carries a usable PackedB; False otherwise (the
    caller then runs on the tensors: the same bits)."""
    given = [w for w in weights if w is not None]
    packed = [_packed_of(w) for w in given]
    if not all(p is not None for p in packed):
        return False
    shared = packed[2:] if len(packed) == 4 else [None, None]
    _C.fused_mega_moe_packed(y, fp8, packed[0], packed[1], sym_buffer._handle, stats, clamp, shared[0], shared[1],
                             **(situ or {}))
    return True


def _check_activation(fn, mma_type, activation):
    """DeepGEMM 2.8: 'swiglu' for every mma_type, 'situ' for 'fp8xfp4' only."""
    if activation not in ('swiglu', 'situ'):
        raise ValueError(f"{fn}: activation must be 'swiglu' or 'situ', got {activation!r}")
    if activation == 'situ' and mma_type != 'fp8xfp4':
        raise ValueError(f"{fn}: only the FP8 x FP4 mega MoE has 'situ' (mma_type {mma_type!r})")


def _check_call(fn, sym_buffer, mma_types, activation, shared_l1_weights, shared_l2_weights):
    if not isinstance(sym_buffer, SymmBuffer):
        raise TypeError(f'{fn}: sym_buffer must be a SymmBuffer, got {type(sym_buffer).__name__}')
    if sym_buffer._handle is None:
        raise RuntimeError(f'{fn}: the symmetric buffer was destroyed')
    if sym_buffer.mma_type not in mma_types:
        raise ValueError(f'{fn}: the buffer was created for mma_type {sym_buffer.mma_type!r}, this call needs '
                         f'{" or ".join(map(repr, mma_types))}')
    _check_activation(fn, sym_buffer.mma_type, activation)
    if (shared_l1_weights is None) != (shared_l2_weights is None):
        raise ValueError(f'{fn}: shared_l1_weights and shared_l2_weights must be given together')
    if (shared_l1_weights is not None) != (sym_buffer.num_shared_experts > 0):
        raise ValueError(f'{fn}: the buffer was created with num_shared_experts={sym_buffer.num_shared_experts}, '
                         f'but shared expert weights were {"not " if shared_l1_weights is None else ""}given')


def fp8_fp4_mega_moe(y: torch.Tensor, l1_weights: Tuple[torch.Tensor, torch.Tensor],
                     l2_weights: Tuple[torch.Tensor, torch.Tensor], sym_buffer: SymmBuffer,
                     shared_l1_weights=None, shared_l2_weights=None,
                     cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                     recipe: Tuple[int, int, int] = (1, 1, 32), activation: str = 'swiglu',
                     activation_clamp: Optional[float] = None, fast_math: bool = True,
                     situ_beta: Optional[float] = None, situ_linear_beta: Optional[float] = None) -> None:
    """y[:T] of this rank's T tokens (placed in sym_buffer.x / x_sf / topk_idx / topk_weights).
    Routed weights: packed FP4 on an 'fp8xfp4' buffer, FP8 (E4M3) on an 'fp8xfp8' one (DeepGEMM
    2.8), (weights, per-1x32 UE8M0 scales) pairs [E/R, 2I, H] and [E/R, H, I].
    Shared experts (buffers with num_shared_experts > 0): (FP8 weights, per-1x32 UE8M0 scales)
    pairs [2 S I, H] and [H, S I], run on this rank's tokens with weight 1 and summed first in
    the combine. fast_math is accepted: the CPU computes SiLU with the library's float32 exp
    either way.
    activation='situ' (DeepGEMM 2.8's SiTU, with situ_beta and situ_linear_beta, no
    activation_clamp): a = sigmoid(g) * (beta * tanh(g / beta)) * (linear_beta * tanh(u /
    linear_beta)) * topk_weight in float32 (C: dg_fp8_fp4_mega_moe_situ)."""
    _check_call('fp8_fp4_mega_moe', sym_buffer, ('fp8xfp4', 'fp8xfp8'), activation, shared_l1_weights,
                shared_l2_weights)
    if tuple(recipe) != (1, 1, 32):
        raise NotImplementedError(f'fp8_fp4_mega_moe: recipe {tuple(recipe)} is not implemented on CPU '
                                  f'(only (1, 1, 32))')
    pairs = [('l1_weights', l1_weights), ('l2_weights', l2_weights)]
    if shared_l1_weights is not None:
        pairs += [('shared_l1_weights', shared_l1_weights), ('shared_l2_weights', shared_l2_weights)]
    for name, w in pairs:
        if not (isinstance(w, (tuple, list)) and len(w) == 2):
            raise TypeError(f'fp8_fp4_mega_moe: {name} must be a (weights, scales) pair')
    situ = _situ_args(activation, activation_clamp, situ_beta, situ_linear_beta)
    if _run_packed(True, y, [l1_weights, l2_weights, shared_l1_weights, shared_l2_weights],
                   sym_buffer, cumulative_local_expert_recv_stats, activation_clamp, situ):
        return
    shared = {} if shared_l1_weights is None else dict(
        shared_l1_weights=shared_l1_weights[0], shared_l1_weights_sf=shared_l1_weights[1],
        shared_l2_weights=shared_l2_weights[0], shared_l2_weights_sf=shared_l2_weights[1])
    _C.fused_fp8_fp4_mega_moe(y, l1_weights[0], l1_weights[1], l2_weights[0], l2_weights[1], sym_buffer._handle,
                              cumulative_local_expert_recv_stats, activation_clamp, **shared, **situ)


def bf16_mega_moe(y: torch.Tensor, l1_weights: torch.Tensor, l2_weights: torch.Tensor, sym_buffer: SymmBuffer,
                  shared_l1_weights=None, shared_l2_weights=None,
                  cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                  activation: str = 'swiglu', activation_clamp: Optional[float] = None,
                  fast_math: bool = True) -> None:
    _check_call('bf16_mega_moe', sym_buffer, ('bf16xbf16',), activation, shared_l1_weights, shared_l2_weights)
    if _run_packed(False, y, [l1_weights, l2_weights, shared_l1_weights, shared_l2_weights],
                   sym_buffer, cumulative_local_expert_recv_stats, activation_clamp):
        return
    _C.fused_bf16_mega_moe(y, l1_weights, l2_weights, sym_buffer._handle, cumulative_local_expert_recv_stats,
                           activation_clamp, shared_l1_weights, shared_l2_weights)


def _is_nvfp4_pair(w) -> bool:
    """An NVFP4 (weights, scales) pair: E2M1 pairs [..., K/2] with INT32 scales [..., K/64] (four
    E4M3 bytes per word, one per 16 values), as DeepGEMM's NVFP4 tests build them."""
    return (isinstance(w, (tuple, list)) and len(w) == 2 and all(isinstance(t, torch.Tensor) for t in w)
            and w[0].dtype in (torch.int8, torch.uint8) and w[1].dtype == torch.int32 and w[0].dim() >= 1
            and w[0].dim() == w[1].dim() and w[1].shape[-1] * 32 == w[0].shape[-1])


def fp4_fp4_mega_moe(y: torch.Tensor, l1_weights: Tuple[torch.Tensor, torch.Tensor],
                     l2_weights: Tuple[torch.Tensor, torch.Tensor], sym_buffer: SymmBuffer,
                     shared_l1_weights: Optional[torch.Tensor] = None, shared_l2_weights: Optional[torch.Tensor] = None,
                     x_bf16: Optional[torch.Tensor] = None,
                     cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                     recipe: Tuple[int, int, int] = (1, 1, 16), activation: str = 'swiglu',
                     activation_clamp: Optional[float] = None, fast_math: bool = True,
                     l1_alphas: Optional[torch.Tensor] = None, l2_alphas: Optional[torch.Tensor] = None,
                     a2_scales: Optional[torch.Tensor] = None, routed_scaling_factor: float = 1.0) -> None:
    """DeepGEMM 2.8's NVFP4 mega MoE on a buffer of mma_type 'fp4xfp4': tokens in buffer.x (E2M1
    pairs, uint8) and buffer.x_sf (int32, four E4M3 scales per word, one per 16 values); routed
    weights (E2M1 pairs int8 [E/R, N, K/2], int32 E4M3 scales [E/R, N, K/64] of any strides, e.g.
    DeepGEMM's MN-major layout; float32 [E/R, N, K/16] scale values are taken too); optional BF16
    shared experts run on x_bf16; l1_alphas [E/R, 2], l2_alphas [E/R] (per-expert model scales)
    and a2_scales [E/R] (the L2 input's global scale, finite and > 0); routed_scaling_factor
    applied to the routed sum before the shared output is added. The chain, rounding by rounding,
    is dg_fp4_fp4_mega_moe's in deepgemm.h (upstream's test reference). fast_math is accepted:
    the library's float32 exp either way. Weights from transform_weights_for_mega_moe run on their
    packed form
    (NVFP4 scales packed as float32 per 1x16; the same bits as the weights read in place)."""
    if not isinstance(sym_buffer, SymmBuffer):
        raise TypeError(f'fp4_fp4_mega_moe: sym_buffer must be a SymmBuffer, got {type(sym_buffer).__name__}')
    if sym_buffer.mma_type != 'fp4xfp4':
        raise ValueError(f'NVFP4 MegaMoE requires an fp4xfp4 symmetric buffer, got {sym_buffer.mma_type!r}')
    if sym_buffer.activation != activation:
        raise ValueError(f'Activation mismatch: buffer={sym_buffer.activation!r}, call={activation!r}')
    if not ((shared_l1_weights is None) == (shared_l2_weights is None) == (x_bf16 is None)):
        raise ValueError('Shared L1 weights, shared L2 weights, and x_bf16 must be provided together')
    num_shared_experts = 0 if shared_l2_weights is None else \
        shared_l2_weights.size(1) // sym_buffer.intermediate_hidden
    if sym_buffer.num_shared_experts != num_shared_experts:
        raise ValueError(f'Shared-expert layout mismatch: buffer={sym_buffer.num_shared_experts}, '
                         f'call={num_shared_experts}')
    _check_call('fp4_fp4_mega_moe', sym_buffer, ('fp4xfp4',), activation, shared_l1_weights, shared_l2_weights)
    if tuple(recipe) != (1, 1, 16):
        raise NotImplementedError(f'fp4_fp4_mega_moe: recipe {tuple(recipe)} is not implemented on CPU '
                                  f'(only NVFP4\'s (1, 1, 16))')
    for name, w in (('l1_weights', l1_weights), ('l2_weights', l2_weights)):
        if not (isinstance(w, (tuple, list)) and len(w) == 2):
            raise TypeError(f'fp4_fp4_mega_moe: {name} must be a (weights, scales) pair')
    extras = dict(x_bf16=x_bf16, l1_alphas=l1_alphas, l2_alphas=l2_alphas, a2_scales=a2_scales,
                  routed_scaling_factor=float(routed_scaling_factor))
    given = [l1_weights, l2_weights] + ([] if shared_l1_weights is None else [shared_l1_weights, shared_l2_weights])
    packed = [_packed_of(w) for w in given]
    if all(p is not None for p in packed):
        shared = packed[2:] or [None, None]
        _C.fused_fp4_fp4_mega_moe_packed(y, packed[0], packed[1], sym_buffer._handle,
                                         cumulative_local_expert_recv_stats, activation_clamp, shared[0], shared[1],
                                         **extras)
        return
    _C.fused_fp4_fp4_mega_moe(y, l1_weights[0], l1_weights[1], l2_weights[0], l2_weights[1], sym_buffer._handle,
                              cumulative_local_expert_recv_stats, activation_clamp,
                              shared_l1_weights=shared_l1_weights, shared_l2_weights=shared_l2_weights, **extras)


class SM90SymmBuffer(SymmBuffer):
    """DeepGEMM 2.8's SM90 (Hopper) symmetric buffer, for fp8_mega_moe: views x (float8_e4m3fn
    [T, H]), x_sf (float32 [T, H/128], one scale per 1x128), topk_idx, topk_weights, with T =
    num_max_tokens_per_rank rounded up to 128 as upstream; l1_acts, l1_acts_sf, l2_acts and
    l2_acts_sf (the GPU kernel's staging) are None: the CPU kernel keeps its activations in its
    own waves. hidden must be a multiple of 256, intermediate_hidden of 128; no shared experts."""

    def __init__(self, group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, use_fp8_dispatch: bool = True, activation: str = 'swiglu'):
        if not use_fp8_dispatch:
            raise ValueError('the SM90 FP8 mega MoE dispatches FP8 tokens only (use_fp8_dispatch=True)')
        if activation != 'swiglu':
            raise ValueError(f"the SM90 FP8 mega MoE supports activation='swiglu' only, got {activation!r}")
        super().__init__(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                         num_shared_experts=0, mma_type='sm90_fp8', activation='swiglu')

    @staticmethod
    def _token_alignment() -> int:
        return _C.get_token_alignment_for_sm90_mega_moe()


def get_symm_buffer_for_sm90_mega_moe(group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                                      hidden: int, intermediate_hidden: int, use_fp8_dispatch: bool = True,
                                      activation: str = 'swiglu') -> SM90SymmBuffer:
    return SM90SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                          use_fp8_dispatch=use_fp8_dispatch, activation=activation)


def _check_sm90_pair(name, pair):
    """An SM90 (FP8 weights, float32 block-128 scales) pair, checked as upstream checks it."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f'{name} must be a (FP8 weights, float32 scales) pair')
    w, sf = pair
    if not isinstance(w, torch.Tensor) or not isinstance(sf, torch.Tensor):
        raise TypeError(f'{name}: the weights and their scales must both be tensors')
    if w.ndim != 3 or sf.ndim != 3:
        raise ValueError(f'{name}: the weights and their scales must both be 3-D ([experts, N, K])')
    if w.dtype != torch.float8_e4m3fn or sf.dtype != torch.float32:
        raise TypeError(f'{name} takes float8_e4m3fn weights with float32 scales, got {w.dtype} and {sf.dtype}')
    if w.device != sf.device:
        raise ValueError(f'{name}: the weights and their scales must be on the same device')
    if not w.is_contiguous() or not sf.is_contiguous():
        raise ValueError(f'{name}: the weights and their scales must be contiguous (their natural layout)')
    e, n, k = w.shape
    if e <= 0 or n <= 0 or k <= 0 or n % 128 or k % 128:
        raise ValueError(f'{name}: need at least one expert and N, K positive multiples of 128, got {tuple(w.shape)}')
    if tuple(sf.shape) != (e, n // 128, k // 128):
        raise ValueError(f'{name}: the scales must be {(e, n // 128, k // 128)} (one per 128x128 block), '
                         f'got {tuple(sf.shape)}')


def transform_weights_for_mega_moe_sm90(l1_weights, l2_weights, pack: bool = True):
    """DeepGEMM 2.8's weight preparation for fp8_mega_moe, with its checks: (FP8 weights, float32
    scales per 128x128 block) pairs [E/R, 2I, H] and [E/R, H, I], H a multiple of 256. DeepGEMM
    interleaves the L1 gate and up rows for its tensor cores; the CPU kernel takes the natural
    layout, so this returns TransformedWeights copies in the input's layout, each carrying (with
    pack=True) its weights packed once for this ISA level (pack_b with recipe_b (128, 128)), which
    fp8_mega_moe runs on. Raw pairs passed to fp8_mega_moe give the same bits."""
    _check_sm90_pair('l1_weights', l1_weights)
    _check_sm90_pair('l2_weights', l2_weights)
    l1, l2 = l1_weights[0], l2_weights[0]
    if l1.shape[0] != l2.shape[0] or l1.shape[1] != 2 * l2.shape[2] or l1.shape[2] != l2.shape[1]:
        raise ValueError(f'the SM90 mega MoE weights must be [E, 2 I, H] and [E, H, I], got {tuple(l1.shape)} '
                         f'and {tuple(l2.shape)}')
    if l2.shape[1] % 256:
        raise ValueError(f'the SM90 mega MoE needs hidden a multiple of 256, got {l2.shape[1]}')
    if l1.device != l2.device:
        raise ValueError('the L1 and L2 weights must be on the same device')

    def transform(pair, gran_a):
        out = TransformedWeights(t.clone() for t in pair)
        if pack:
            out.packed = _C.pack_b(tuple(out), recipe_a=(1, gran_a), recipe_b=(128, 128))
        return out
    return transform(l1_weights, 128), transform(l2_weights, 64)


def fp8_mega_moe(y: torch.Tensor, l1_weights: Tuple[torch.Tensor, torch.Tensor],
                 l2_weights: Tuple[torch.Tensor, torch.Tensor], sym_buffer: SM90SymmBuffer,
                 cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                 recipe: Tuple[int, int, int] = (128, 128, 128), activation: str = 'swiglu',
                 activation_clamp: Optional[float] = None, fast_math: bool = True) -> None:
    """DeepGEMM 2.8's SM90 FP8 mega MoE: y[:T] of this rank's T tokens (placed in sym_buffer.x,
    x_sf, topk_idx, topk_weights of a get_symm_buffer_for_sm90_mega_moe buffer); routed weights
    (float8_e4m3fn, float32 scales per 128x128 block) pairs [E/R, 2I, H] and [E/R, H, I], raw or
    from transform_weights_for_mega_moe_sm90. The chain, rounding by rounding, is dg_fp8_mega_moe's
    in deepgemm.h: float32 L1, SwiGLU with the clamp (gate from above, up both sides) and the
    top-k weight, FP8 activations with power-of-two scales per 1x64, BF16 L2 rows summed in slot
    order. fast_math is accepted: the library's float32 exp either way."""
    if not isinstance(sym_buffer, SM90SymmBuffer):
        raise TypeError(f'fp8_mega_moe: sym_buffer must be an SM90SymmBuffer (get_symm_buffer_for_sm90_mega_moe), '
                        f'got {type(sym_buffer).__name__}')
    if sym_buffer._handle is None:
        raise RuntimeError('fp8_mega_moe: the symmetric buffer was destroyed')
    if tuple(recipe) != (128, 128, 128):
        raise ValueError(f'fp8_mega_moe: the SM90 FP8 mega MoE takes recipe (128, 128, 128), got {tuple(recipe)}')
    if activation != 'swiglu':
        raise ValueError(f"fp8_mega_moe: the SM90 FP8 mega MoE supports activation='swiglu' only, got {activation!r}")
    for name, w in (('l1_weights', l1_weights), ('l2_weights', l2_weights)):
        if not (isinstance(w, (tuple, list)) and len(w) == 2):
            raise TypeError(f'fp8_mega_moe: {name} must be a (weights, scales) pair')
    packed = [_packed_of(w) for w in (l1_weights, l2_weights)]
    if all(p is not None for p in packed):
        _C.fused_fp8_mega_moe_packed(y, packed[0], packed[1], sym_buffer._handle, cumulative_local_expert_recv_stats,
                                     activation_clamp)
        return
    _C.fused_fp8_mega_moe(y, l1_weights[0], l1_weights[1], l2_weights[0], l2_weights[1], sym_buffer._handle,
                          cumulative_local_expert_recv_stats, activation_clamp)


def _missing(name, why):
    def fn(*args, **kwargs):
        raise NotImplementedError(f'deep_gemm_cpu.{name} is not implemented: {why}')
    fn.__name__ = fn.__qualname__ = name
    return fn


get_ring_limit_for_mega_moe = _missing('get_ring_limit_for_mega_moe', 'the CPU kernel has no ring buffer')

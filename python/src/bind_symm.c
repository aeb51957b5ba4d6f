/*
 * bind_symm.c - the symmetric buffer and the fused mega MoE calls for deep_gemm_cpu.mega:
 *   symm_buffer_create(num_ranks, rank, num_experts, num_max_tokens_per_rank, num_topk, hidden,
 *                      intermediate_hidden, num_shared_experts, mma_type, name) -> handle
 *   symm_buffer_attach(handle), symm_buffer_seal(handle), symm_buffer_destroy(handle)
 *   symm_buffer_view(handle, field) -> (address, rows, cols, dtype name)
 *   symm_buffer_size(...same configuration as create, without rank and name...) -> bytes
 *   fp8_fp4_mega_moe(y, l1, l1_sf, l2, l2_sf, handle, stats, activation_clamp)
 *   bf16_mega_moe(y, l1, l2, handle, stats, activation_clamp)
 *   fused_fp4_fp4_mega_moe(y, l1, l1_sf, l2, l2_sf, handle, stats, activation_clamp, ...extras)
 *   fused_fp8_mega_moe(y, l1, l1_sf, l2, l2_sf, handle, stats, activation_clamp) (SM90; and _packed)
 * The bootstrap (names, barriers between create, attach and seal) is Python's: mega.py runs it
 * over a torch.distributed group or an mpi4py communicator.
 *
 * Lifetime: the handle is a capsule; destroy() only marks it destroyed (calls then raise), the
 * mappings are freed when the capsule is collected, i.e. after the last tensor view over the
 * segment (each view keeps the capsule alive), so a view never outlives its memory.
 */
#include "dgpy.h"

#include <math.h>
#include <string.h>

#define CAPSULE_NAME "deep_gemm_cpu.symm_buffer"

typedef struct handle {
    dg_symm_buffer *buf;
    int destroyed;
} handle;

static void capsule_free(PyObject *cap) {
    handle *h = PyCapsule_GetPointer(cap, CAPSULE_NAME);
    if (h) {
        dg_symm_buffer_destroy(h->buf);
        PyMem_Free(h);
    }
}

static handle *get_handle(PyObject *obj, const char *fn, int live) {
    if (!PyCapsule_IsValid(obj, CAPSULE_NAME)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a symmetric buffer handle, got %s", fn, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    handle *h = PyCapsule_GetPointer(obj, CAPSULE_NAME);
    if (live && h->destroyed) {
        PyErr_Format(PyExc_RuntimeError, "%s: the symmetric buffer was destroyed", fn);
        return NULL;
    }
    return h;
}

static int parse_mma(PyObject *obj, const char *fn, dg_mega_moe_mma *out) {
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'mma_type' must be a str", fn);
        return -1;
    }
    if (!strcmp(s, "fp8xfp4"))
        *out = DG_MEGA_MOE_FP8XFP4;
    else if (!strcmp(s, "bf16xbf16"))
        *out = DG_MEGA_MOE_BF16XBF16;
    else if (!strcmp(s, "fp8xfp8"))
        *out = DG_MEGA_MOE_FP8XFP8;
    else if (!strcmp(s, "fp4xfp4"))
        *out = DG_MEGA_MOE_FP4XFP4;
    else if (!strcmp(s, "sm90_fp8")) /* the module's name for DeepGEMM's SM90SymmBuffer */
        *out = DG_MEGA_MOE_SM90_FP8;
    else {
        PyErr_Format(PyExc_NotImplementedError,
                     "%s: mma_type '%s' is not implemented on CPU (fp8xfp4, fp8xfp8, fp4xfp4 and bf16xbf16 are; "
                     "the SM90 buffer is get_symm_buffer_for_sm90_mega_moe's)", fn, s);
        return -1;
    }
    return 0;
}

/* The configuration arguments shared by create and size (rank and name optional). */
static int parse_config(PyObject *args, PyObject *kw, const char *fn, int with_rank, dg_mega_moe_config *c,
                        const char **name) {
    static char *kw_create[] = {"num_ranks", "rank", "num_experts", "num_max_tokens_per_rank", "num_topk", "hidden",
                                "intermediate_hidden", "num_shared_experts", "mma_type", "name", NULL};
    static char *kw_size[] = {"num_ranks", "num_experts", "num_max_tokens_per_rank", "num_topk", "hidden",
                              "intermediate_hidden", "num_shared_experts", "mma_type", NULL};
    PyObject *o[8], *mma, *rank = NULL;
    memset(c, 0, sizeof *c);
    int ok = with_rank ? PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOs", kw_create, &o[0], &rank, &o[1], &o[2],
                                                     &o[3], &o[4], &o[5], &o[6], &mma, name)
                       : PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOO", kw_size, &o[0], &o[1], &o[2], &o[3],
                                                     &o[4], &o[5], &o[6], &mma);
    if (!ok)
        return -1;
    if (dgp_int(o[0], fn, "num_ranks", &c->num_ranks) || (rank && dgp_int(rank, fn, "rank", &c->rank)) ||
        dgp_int64(o[1], fn, "num_experts", &c->num_experts) ||
        dgp_int64(o[2], fn, "num_max_tokens_per_rank", &c->num_max_tokens_per_rank) ||
        dgp_int64(o[3], fn, "num_topk", &c->num_topk) || dgp_int64(o[4], fn, "hidden", &c->hidden) ||
        dgp_int64(o[5], fn, "intermediate_hidden", &c->intermediate_hidden) ||
        dgp_int64(o[6], fn, "num_shared_experts", &c->num_shared_experts) || parse_mma(mma, fn, &c->mma))
        return -1;
    return 0;
}

static PyObject *py_symm_buffer_create(PyObject *s, PyObject *args, PyObject *kw) {
    dg_mega_moe_config c;
    const char *name = NULL;
    if (parse_config(args, kw, "symm_buffer_create", 1, &c, &name))
        return NULL;
    dg_symm_buffer *b = NULL;
    dg_status st;
    DGP_NOGIL(st, dg_symm_buffer_create(&c, name, &b));
    if (st != DG_OK)
        return dgp_raise(st);
    handle *h = PyMem_Calloc(1, sizeof *h);
    if (!h) {
        dg_symm_buffer_destroy(b);
        return PyErr_NoMemory();
    }
    h->buf = b;
    PyObject *cap = PyCapsule_New(h, CAPSULE_NAME, capsule_free);
    if (!cap) {
        dg_symm_buffer_destroy(b);
        PyMem_Free(h);
    }
    return cap;
}

/* symm_buffer_create_mpi(comm_address, num_experts, ...): comm_address is mpi4py's
 * MPI._addressof(comm), the address of the communicator's MPI_Comm handle. */
static PyObject *py_symm_buffer_create_mpi(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"comm_address", "num_experts", "num_max_tokens_per_rank", "num_topk", "hidden",
                          "intermediate_hidden", "num_shared_experts", "mma_type", NULL};
    const char *fn = "symm_buffer_create_mpi";
    PyObject *addr, *o[6], *mma;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOO", kwl, &addr, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                     &mma))
        return NULL;
    dg_mega_moe_config c;
    memset(&c, 0, sizeof c);
    const unsigned long long a = PyLong_AsUnsignedLongLong(addr);
    if (PyErr_Occurred() || dgp_int64(o[0], fn, "num_experts", &c.num_experts) ||
        dgp_int64(o[1], fn, "num_max_tokens_per_rank", &c.num_max_tokens_per_rank) ||
        dgp_int64(o[2], fn, "num_topk", &c.num_topk) || dgp_int64(o[3], fn, "hidden", &c.hidden) ||
        dgp_int64(o[4], fn, "intermediate_hidden", &c.intermediate_hidden) ||
        dgp_int64(o[5], fn, "num_shared_experts", &c.num_shared_experts) || parse_mma(mma, fn, &c.mma))
        return NULL;
    if (a == 0) {
        PyErr_Format(PyExc_ValueError, "%s: comm_address is 0", fn);
        return NULL;
    }
    dg_symm_buffer *b = NULL;
    dg_status st;
    DGP_NOGIL(st, dg_symm_buffer_create_mpi((const void *)(uintptr_t)a, &c, &b));
    if (st != DG_OK)
        return dgp_raise(st);
    handle *h = PyMem_Calloc(1, sizeof *h);
    if (!h) {
        dg_symm_buffer_destroy(b);
        return PyErr_NoMemory();
    }
    h->buf = b;
    PyObject *cap = PyCapsule_New(h, CAPSULE_NAME, capsule_free);
    if (!cap) {
        dg_symm_buffer_destroy(b);
        PyMem_Free(h);
    }
    return cap;
}

static PyObject *py_has_mpi(PyObject *s, PyObject *noargs) { return PyBool_FromLong(dg_has_mpi()); }
static PyObject *py_mpi_library_version(PyObject *s, PyObject *noargs) {
    return PyUnicode_FromString(dg_mpi_library_version());
}

static PyObject *py_symm_buffer_size(PyObject *s, PyObject *args, PyObject *kw) {
    dg_mega_moe_config c;
    if (parse_config(args, kw, "get_symm_buffer_size_for_mega_moe", 0, &c, NULL))
        return NULL;
    int64_t bytes = 0;
    dg_status st = dg_get_symm_buffer_size_for_mega_moe(&c, &bytes);
    if (st != DG_OK)
        return dgp_raise(st);
    return PyLong_FromLongLong((long long)bytes);
}

static PyObject *step(PyObject *args, const char *fn, dg_status (*f)(dg_symm_buffer *)) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    if (!h)
        return NULL;
    dg_status st;
    DGP_NOGIL(st, f(h->buf));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}
static PyObject *py_symm_buffer_attach(PyObject *s, PyObject *args) {
    return step(args, "symm_buffer_attach", dg_symm_buffer_attach);
}
static PyObject *py_symm_buffer_seal(PyObject *s, PyObject *args) {
    return step(args, "symm_buffer_seal", dg_symm_buffer_seal);
}

static PyObject *py_symm_buffer_destroy(PyObject *s, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    handle *h = get_handle(cap, "symm_buffer_destroy", 0);
    if (!h)
        return NULL;
    h->destroyed = 1;
    Py_RETURN_NONE;
}

static PyObject *py_symm_buffer_view(PyObject *s, PyObject *args) {
    PyObject *cap;
    const char *field;
    if (!PyArg_ParseTuple(args, "Os", &cap, &field))
        return NULL;
    handle *h = get_handle(cap, "symm_buffer_view", 1);
    if (!h)
        return NULL;
    dg_tensor t;
    dg_status st = dg_symm_buffer_view(h->buf, field, &t);
    if (st != DG_OK)
        return dgp_raise(st);
    return Py_BuildValue("(KLLs)", (unsigned long long)(uintptr_t)t.data, (long long)t.shape[0],
                         (long long)t.shape[1], dg_dtype_name(t.dtype));
}

static int parse_clamp(PyObject *obj, const char *fn, float *out) {
    *out = INFINITY;
    if (obj == Py_None)
        return 0;
    const double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: argument 'activation_clamp' must be a float or None, got %s", fn,
                         Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    *out = (float)v;
    return 0;
}

static PyObject *fused(PyObject *args, PyObject *kw, int fp8) {
    const char *fn = fp8 ? "fp8_fp4_mega_moe" : "bf16_mega_moe";
    static char *kw8[] = {"y", "l1_weights", "l1_weights_sf", "l2_weights", "l2_weights_sf", "buffer",
                          "cumulative_local_expert_recv_stats", "activation_clamp", "shared_l1_weights",
                          "shared_l1_weights_sf", "shared_l2_weights", "shared_l2_weights_sf", "situ_beta",
                          "situ_linear_beta", NULL};
    static char *kw16[] = {"y", "l1_weights", "l2_weights", "buffer", "cumulative_local_expert_recv_stats",
                           "activation_clamp", "shared_l1_weights", "shared_l2_weights", NULL};
    PyObject *y, *l1, *l1sf = NULL, *l2, *l2sf = NULL, *cap, *stats = Py_None, *clamp_obj = Py_None;
    PyObject *s1 = Py_None, *s1sf = Py_None, *s2 = Py_None, *s2sf = Py_None;
    float situ[2] = {0.0f, 0.0f}; /* betas; 0: SwiGLU (the module passes both or neither) */
    int ok = fp8 ? PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|OOOOOOff", kw8, &y, &l1, &l1sf, &l2, &l2sf, &cap,
                                               &stats, &clamp_obj, &s1, &s1sf, &s2, &s2sf, &situ[0], &situ[1])
                 : PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOOO", kw16, &y, &l1, &l2, &cap, &stats, &clamp_obj,
                                               &s1, &s2);
    if (!ok)
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    dgp_tensor ty = {0}, t1 = {0}, t1s = {0}, t2 = {0}, t2s = {0}, ts = {0}, u1 = {0}, u1s = {0}, u2 = {0}, u2s = {0};
    const int opt = DGP_OPTIONAL;
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) || dgp_tensor_from(l1, fn, "l1_weights", 0, &t1) ||
        (fp8 && dgp_tensor_from(l1sf, fn, "l1_weights_sf", 0, &t1s)) ||
        dgp_tensor_from(l2, fn, "l2_weights", 0, &t2) ||
        (fp8 && dgp_tensor_from(l2sf, fn, "l2_weights_sf", 0, &t2s)) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", opt | DGP_WRITABLE, &ts) ||
        dgp_tensor_from(s1, fn, "shared_l1_weights", opt, &u1) || dgp_tensor_from(s2, fn, "shared_l2_weights", opt, &u2) ||
        (fp8 && (dgp_tensor_from(s1sf, fn, "shared_l1_weights_sf", opt, &u1s) ||
                 dgp_tensor_from(s2sf, fn, "shared_l2_weights_sf", opt, &u2s))))
        return NULL;
    dg_status st;
    if (fp8 && (situ[0] != 0.0f || situ[1] != 0.0f))
        DGP_NOGIL(st, dg_fp8_fp4_mega_moe_situ(&ty.t, &t1.t, &t1s.t, &t2.t, &t2s.t, dgp_ptr(&u1), dgp_ptr(&u1s),
                                               dgp_ptr(&u2), dgp_ptr(&u2s), h->buf, dgp_ptr(&ts), situ[0], situ[1]));
    else if (fp8)
        DGP_NOGIL(st, dg_fp8_fp4_mega_moe(&ty.t, &t1.t, &t1s.t, &t2.t, &t2s.t, dgp_ptr(&u1), dgp_ptr(&u1s),
                                          dgp_ptr(&u2), dgp_ptr(&u2s), h->buf, dgp_ptr(&ts), clamp));
    else
        DGP_NOGIL(st, dg_bf16_mega_moe(&ty.t, &t1.t, &t2.t, dgp_ptr(&u1), dgp_ptr(&u2), h->buf, dgp_ptr(&ts), clamp));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}
/* Holds the PackedB's w[0..3] (w[2], w[3] may be None) for a call; returns how many slots were
 * processed (4: all held; fewer: an error is set). release_weights undoes it. */
static const char *const kPackedNames[4] = {"l1_weights", "l2_weights", "shared_l1_weights", "shared_l2_weights"};
static int hold_weights(PyObject *const w[4], const char *fn, const dg_packed_b *p[4]) {
    int held = 0;
    for (; held < 4; ++held) {
        if (held >= 2 && w[held] == Py_None)
            continue;
        if (!dgp_is_packed(w[held])) {
            PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a PackedB, got %s", fn, kPackedNames[held],
                         Py_TYPE(w[held])->tp_name);
            break;
        }
        if (dgp_packed_hold(w[held], fn, kPackedNames[held], &p[held])) /* the library checks the rest */
            break;
    }
    return held;
}

static void release_weights(PyObject *const w[4], const dg_packed_b *p[4], int held) {
    for (int i = 0; i < held; ++i)
        if (p[i])
            dgp_packed_end(w[i]);
}

/* The `_packed` calls: l1 / l2 PackedB's of this rank's experts ([E/R, N, K], pack_b), the
 * shared ones dense PackedB's or None. Each stays held (dgp_packed_begin) until the call returns. */
static PyObject *fused_packed(PyObject *args, PyObject *kw) {
    const char *fn;
    static char *kwl[] = {"y", "fp8", "l1_weights", "l2_weights", "buffer", "cumulative_local_expert_recv_stats",
                          "activation_clamp", "shared_l1_weights", "shared_l2_weights", "situ_beta",
                          "situ_linear_beta", NULL};
    PyObject *y, *cap, *stats = Py_None, *clamp_obj = Py_None, *w[4] = {NULL, NULL, Py_None, Py_None};
    int fp8;
    float situ[2] = {0.0f, 0.0f}; /* betas; 0: SwiGLU */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OpOOO|OOOOff", kwl, &y, &fp8, &w[0], &w[1], &cap, &stats, &clamp_obj,
                                     &w[2], &w[3], &situ[0], &situ[1]))
        return NULL;
    fn = fp8 ? "fp8_fp4_mega_moe" : "bf16_mega_moe";
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    dgp_tensor ty = {0}, ts = {0};
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", DGP_OPTIONAL | DGP_WRITABLE, &ts))
        return NULL;
    const dg_packed_b *p[4] = {NULL, NULL, NULL, NULL};
    const int held = hold_weights(w, fn, p);
    PyObject *result = NULL;
    if (held == 4) {
        dg_status st;
        if (fp8 && (situ[0] != 0.0f || situ[1] != 0.0f))
            DGP_NOGIL(st, dg_fp8_fp4_mega_moe_packed_situ(&ty.t, p[0], p[1], p[2], p[3], h->buf, dgp_ptr(&ts), situ[0],
                                                          situ[1]));
        else if (fp8)
            DGP_NOGIL(st, dg_fp8_fp4_mega_moe_packed(&ty.t, p[0], p[1], p[2], p[3], h->buf, dgp_ptr(&ts), clamp));
        else
            DGP_NOGIL(st, dg_bf16_mega_moe_packed(&ty.t, p[0], p[1], p[2], p[3], h->buf, dgp_ptr(&ts), clamp));
        if (st != DG_OK)
            dgp_raise(st);
        else
            Py_INCREF(Py_None), result = Py_None;
    }
    release_weights(w, p, held);
    return result;
}

/* The NVFP4 call: routed weights and their INT32 (E4M3 bytes) or FLOAT32 scales; the extras of
 * dg_fp4_fp4_mega_moe_extras as keywords (None: not given). */
static PyObject *py_fp4_fp4_mega_moe(PyObject *s, PyObject *args, PyObject *kw) {
    const char *fn = "fp4_fp4_mega_moe";
    static char *kwl[] = {"y", "l1_weights", "l1_weights_sf", "l2_weights", "l2_weights_sf", "buffer",
                          "cumulative_local_expert_recv_stats", "activation_clamp", "shared_l1_weights",
                          "shared_l2_weights", "x_bf16", "l1_alphas", "l2_alphas", "a2_scales",
                          "routed_scaling_factor", NULL};
    PyObject *y, *l1, *l1sf, *l2, *l2sf, *cap, *stats = Py_None, *clamp_obj = Py_None;
    PyObject *o[6] = {Py_None, Py_None, Py_None, Py_None, Py_None, Py_None};
    double rsf = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|OOOOOOOOd", kwl, &y, &l1, &l1sf, &l2, &l2sf, &cap, &stats,
                                     &clamp_obj, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &rsf))
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    static const char *names[6] = {"shared_l1_weights", "shared_l2_weights", "x_bf16", "l1_alphas", "l2_alphas",
                                   "a2_scales"};
    dgp_tensor ty = {0}, t1 = {0}, t1s = {0}, t2 = {0}, t2s = {0}, ts = {0}, ex[6];
    memset(ex, 0, sizeof ex);
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) || dgp_tensor_from(l1, fn, "l1_weights", 0, &t1) ||
        dgp_tensor_from(l1sf, fn, "l1_weights_sf", 0, &t1s) || dgp_tensor_from(l2, fn, "l2_weights", 0, &t2) ||
        dgp_tensor_from(l2sf, fn, "l2_weights_sf", 0, &t2s) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", DGP_OPTIONAL | DGP_WRITABLE, &ts))
        return NULL;
    for (int i = 0; i < 6; ++i)
        if (dgp_tensor_from(o[i], fn, names[i], DGP_OPTIONAL, &ex[i]))
            return NULL;
    dg_fp4_fp4_mega_moe_extras e = dg_fp4_fp4_mega_moe_extras_default();
    e.shared_l1_weights = dgp_ptr(&ex[0]), e.shared_l2_weights = dgp_ptr(&ex[1]), e.x_bf16 = dgp_ptr(&ex[2]);
    e.l1_alphas = dgp_ptr(&ex[3]), e.l2_alphas = dgp_ptr(&ex[4]), e.a2_scales = dgp_ptr(&ex[5]);
    e.routed_scaling_factor = (float)rsf;
    dg_status st;
    DGP_NOGIL(st, dg_fp4_fp4_mega_moe(&ty.t, &t1.t, &t1s.t, &t2.t, &t2s.t, &e, h->buf, dgp_ptr(&ts), clamp));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

/* The NVFP4 call on PackedB weights (routed grouped, shared dense BF16 or None). */
static PyObject *py_fp4_fp4_mega_moe_packed(PyObject *s, PyObject *args, PyObject *kw) {
    const char *fn = "fp4_fp4_mega_moe";
    static char *kwl[] = {"y", "l1_weights", "l2_weights", "buffer", "cumulative_local_expert_recv_stats",
                          "activation_clamp", "shared_l1_weights", "shared_l2_weights", "x_bf16", "l1_alphas",
                          "l2_alphas", "a2_scales", "routed_scaling_factor", NULL};
    PyObject *y, *cap, *stats = Py_None, *clamp_obj = Py_None, *w[4] = {NULL, NULL, Py_None, Py_None};
    PyObject *o[4] = {Py_None, Py_None, Py_None, Py_None};
    double rsf = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOOOOOOOd", kwl, &y, &w[0], &w[1], &cap, &stats, &clamp_obj,
                                     &w[2], &w[3], &o[0], &o[1], &o[2], &o[3], &rsf))
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    static const char *names[4] = {"x_bf16", "l1_alphas", "l2_alphas", "a2_scales"};
    dgp_tensor ty = {0}, ts = {0}, ex[4];
    memset(ex, 0, sizeof ex);
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", DGP_OPTIONAL | DGP_WRITABLE, &ts))
        return NULL;
    for (int i = 0; i < 4; ++i)
        if (dgp_tensor_from(o[i], fn, names[i], DGP_OPTIONAL, &ex[i]))
            return NULL;
    dg_fp4_fp4_mega_moe_extras e = dg_fp4_fp4_mega_moe_extras_default();
    e.x_bf16 = dgp_ptr(&ex[0]), e.l1_alphas = dgp_ptr(&ex[1]), e.l2_alphas = dgp_ptr(&ex[2]);
    e.a2_scales = dgp_ptr(&ex[3]), e.routed_scaling_factor = (float)rsf;
    const dg_packed_b *p[4] = {NULL, NULL, NULL, NULL};
    const int held = hold_weights(w, fn, p);
    PyObject *result = NULL;
    if (held == 4) {
        dg_status st;
        DGP_NOGIL(st, dg_fp4_fp4_mega_moe_packed(&ty.t, p[0], p[1], p[2], p[3], &e, h->buf, dgp_ptr(&ts), clamp));
        if (st != DG_OK)
            dgp_raise(st);
        else
            Py_INCREF(Py_None), result = Py_None;
    }
    release_weights(w, p, held);
    return result;
}

/* The SM90 FP8 call: E4M3 weights with FLOAT32 128x128 block scales (dg_fp8_mega_moe). */
static PyObject *py_fp8_mega_moe(PyObject *s, PyObject *args, PyObject *kw) {
    const char *fn = "fp8_mega_moe";
    static char *kwl[] = {"y", "l1_weights", "l1_weights_sf", "l2_weights", "l2_weights_sf", "buffer",
                          "cumulative_local_expert_recv_stats", "activation_clamp", NULL};
    PyObject *y, *l1, *l1sf, *l2, *l2sf, *cap, *stats = Py_None, *clamp_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|OO", kwl, &y, &l1, &l1sf, &l2, &l2sf, &cap, &stats,
                                     &clamp_obj))
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    dgp_tensor ty = {0}, t1 = {0}, t1s = {0}, t2 = {0}, t2s = {0}, ts = {0};
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) || dgp_tensor_from(l1, fn, "l1_weights", 0, &t1) ||
        dgp_tensor_from(l1sf, fn, "l1_weights_sf", 0, &t1s) || dgp_tensor_from(l2, fn, "l2_weights", 0, &t2) ||
        dgp_tensor_from(l2sf, fn, "l2_weights_sf", 0, &t2s) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", DGP_OPTIONAL | DGP_WRITABLE, &ts))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_fp8_mega_moe(&ty.t, &t1.t, &t1s.t, &t2.t, &t2s.t, h->buf, dgp_ptr(&ts), clamp));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_fp8_mega_moe_packed(PyObject *s, PyObject *args, PyObject *kw) {
    const char *fn = "fp8_mega_moe";
    static char *kwl[] = {"y", "l1_weights", "l2_weights", "buffer", "cumulative_local_expert_recv_stats",
                          "activation_clamp", NULL};
    PyObject *y, *cap, *stats = Py_None, *clamp_obj = Py_None, *w[4] = {NULL, NULL, Py_None, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OO", kwl, &y, &w[0], &w[1], &cap, &stats, &clamp_obj))
        return NULL;
    handle *h = get_handle(cap, fn, 1);
    float clamp;
    if (!h || parse_clamp(clamp_obj, fn, &clamp))
        return NULL;
    dgp_tensor ty = {0}, ts = {0};
    if (dgp_tensor_from(y, fn, "y", DGP_WRITABLE, &ty) ||
        dgp_tensor_from(stats, fn, "cumulative_local_expert_recv_stats", DGP_OPTIONAL | DGP_WRITABLE, &ts))
        return NULL;
    const dg_packed_b *p[4] = {NULL, NULL, NULL, NULL};
    const int held = hold_weights(w, fn, p);
    PyObject *result = NULL;
    if (held == 4) {
        dg_status st;
        DGP_NOGIL(st, dg_fp8_mega_moe_packed(&ty.t, p[0], p[1], h->buf, dgp_ptr(&ts), clamp));
        if (st != DG_OK)
            dgp_raise(st);
        else
            Py_INCREF(Py_None), result = Py_None;
    }
    release_weights(w, p, held);
    return result;
}

static PyObject *py_fp8_fp4_mega_moe(PyObject *s, PyObject *args, PyObject *kw) { return fused(args, kw, 1); }
static PyObject *py_bf16_mega_moe(PyObject *s, PyObject *args, PyObject *kw) { return fused(args, kw, 0); }
static PyObject *py_fused_packed(PyObject *s, PyObject *args, PyObject *kw) { return fused_packed(args, kw); }

static PyObject *py_token_alignment(PyObject *s, PyObject *noargs) {
    return PyLong_FromLongLong((long long)dg_get_token_alignment_for_mega_moe());
}
static PyObject *py_sm90_token_alignment(PyObject *s, PyObject *noargs) {
    return PyLong_FromLongLong((long long)dg_get_token_alignment_for_sm90_mega_moe());
}

#define KW (PyCFunction)(void (*)(void))
PyMethodDef dgp_symm_methods[] = {
    {"symm_buffer_create", KW py_symm_buffer_create, METH_VARARGS | METH_KEYWORDS,
     "symm_buffer_create(num_ranks, rank, num_experts, num_max_tokens_per_rank, num_topk, hidden, "
     "intermediate_hidden, num_shared_experts, mma_type, name): this rank's segment (bootstrap step 1)"},
    {"symm_buffer_create_mpi", KW py_symm_buffer_create_mpi, METH_VARARGS | METH_KEYWORDS,
     "symm_buffer_create_mpi(comm_address, num_experts, num_max_tokens_per_rank, num_topk, hidden, "
     "intermediate_hidden, num_shared_experts, mma_type): collective over an mpi4py communicator "
     "(MPI._addressof(comm)); shared memory on one machine, MPI across machines"},
    {"has_mpi", py_has_mpi, METH_NOARGS, "whether the library was built with MPI"},
    {"mpi_library_version", py_mpi_library_version, METH_NOARGS,
     "MPI_Get_library_version of the library's MPI (empty without MPI)"},
    {"symm_buffer_size", KW py_symm_buffer_size, METH_VARARGS | METH_KEYWORDS,
     "symm_buffer_size(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, "
     "num_shared_experts, mma_type): bytes of one rank's segment"},
    {"symm_buffer_attach", py_symm_buffer_attach, METH_VARARGS, "map the peers' segments (bootstrap step 2)"},
    {"symm_buffer_seal", py_symm_buffer_seal, METH_VARARGS, "remove the segment names (bootstrap step 3)"},
    {"symm_buffer_destroy", py_symm_buffer_destroy, METH_VARARGS, "mark the handle destroyed"},
    {"symm_buffer_view", py_symm_buffer_view, METH_VARARGS,
     "symm_buffer_view(handle, field) -> (address, rows, cols, dtype name)"},
    {"fused_fp8_fp4_mega_moe", KW py_fp8_fp4_mega_moe, METH_VARARGS | METH_KEYWORDS,
     "fused_fp8_fp4_mega_moe(y, l1_weights, l1_weights_sf, l2_weights, l2_weights_sf, buffer, "
     "cumulative_local_expert_recv_stats=None, activation_clamp=None, shared_l1_weights=None, "
     "shared_l1_weights_sf=None, shared_l2_weights=None, shared_l2_weights_sf=None, situ_beta=0, situ_linear_beta=0 "
     "(betas given: SiTU)"},
    {"fused_fp4_fp4_mega_moe", KW py_fp4_fp4_mega_moe, METH_VARARGS | METH_KEYWORDS,
     "fused_fp4_fp4_mega_moe(y, l1_weights, l1_weights_sf, l2_weights, l2_weights_sf, buffer, "
     "cumulative_local_expert_recv_stats=None, activation_clamp=None, shared_l1_weights=None, "
     "shared_l2_weights=None, x_bf16=None, l1_alphas=None, l2_alphas=None, a2_scales=None, "
     "routed_scaling_factor=1.0): the NVFP4 mega MoE (dg_fp4_fp4_mega_moe)"},
    {"fused_fp4_fp4_mega_moe_packed", KW py_fp4_fp4_mega_moe_packed, METH_VARARGS | METH_KEYWORDS,
     "fused_fp4_fp4_mega_moe_packed(y, l1_weights, l2_weights, buffer, cumulative_local_expert_recv_stats=None, "
     "activation_clamp=None, shared_l1_weights=None, shared_l2_weights=None, x_bf16=None, l1_alphas=None, "
     "l2_alphas=None, a2_scales=None, routed_scaling_factor=1.0): the NVFP4 call on PackedB weights"},
    {"fused_fp8_mega_moe", KW py_fp8_mega_moe, METH_VARARGS | METH_KEYWORDS,
     "fused_fp8_mega_moe(y, l1_weights, l1_weights_sf, l2_weights, l2_weights_sf, buffer, "
     "cumulative_local_expert_recv_stats=None, activation_clamp=None): the SM90 FP8 mega MoE (dg_fp8_mega_moe)"},
    {"fused_fp8_mega_moe_packed", KW py_fp8_mega_moe_packed, METH_VARARGS | METH_KEYWORDS,
     "fused_fp8_mega_moe_packed(y, l1_weights, l2_weights, buffer, cumulative_local_expert_recv_stats=None, "
     "activation_clamp=None): the SM90 FP8 mega MoE on PackedB weights (dg_fp8_mega_moe_packed)"},
    {"fused_bf16_mega_moe", KW py_bf16_mega_moe, METH_VARARGS | METH_KEYWORDS,
     "fused_bf16_mega_moe(y, l1_weights, l2_weights, buffer, cumulative_local_expert_recv_stats=None, "
     "activation_clamp=None, shared_l1_weights=None, shared_l2_weights=None)"},
    {"fused_mega_moe_packed", KW py_fused_packed, METH_VARARGS | METH_KEYWORDS,
     "fused_mega_moe_packed(y, fp8, l1_weights, l2_weights, buffer, cumulative_local_expert_recv_stats=None, "
     "activation_clamp=None, shared_l1_weights=None, shared_l2_weights=None): the calls on PackedB weights"},
    {"get_token_alignment_for_sm90_mega_moe", py_sm90_token_alignment, METH_NOARGS,
     "dg_get_token_alignment_for_sm90_mega_moe()"},
    {"get_token_alignment_for_mega_moe", py_token_alignment, METH_NOARGS,
     "rows num_max_tokens_per_rank is rounded up to"},
    {NULL, NULL, 0, NULL},
};

/*
 * bind_misc.c - runtime settings, tf32_hc_prenorm_gemm, mega_mhc, einsum, fp8_einsum and the scale-factor
 * layout functions (which return new tensors through the library's query form).
 */
#include "dgpy.h"

#include <string.h>

static PyObject *status_none(dg_status st) {
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

/* ---- runtime ----------------------------------------------------------------------------- */

static PyObject *py_set_num_sms(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"new_num_sms", NULL};
    PyObject *o;
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_num_sms", kwl, &o) ||
        dgp_int(o, "set_num_sms", "new_num_sms", &v))
        return NULL;
    return status_none(dg_set_num_sms(v));
}
static PyObject *py_get_num_sms(PyObject *s, PyObject *unused) { return PyLong_FromLong(dg_get_num_sms()); }
static PyObject *py_set_tc_util(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"new_tc_util", NULL};
    PyObject *o;
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_tc_util", kwl, &o) ||
        dgp_int(o, "set_tc_util", "new_tc_util", &v))
        return NULL;
    return status_none(dg_set_tc_util(v));
}
static PyObject *py_get_tc_util(PyObject *s, PyObject *unused) { return PyLong_FromLong(dg_get_tc_util()); }
static PyObject *py_set_pdl(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"new_enable_pdl", NULL};
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "p:set_pdl", kwl, &v))
        return NULL;
    dg_set_pdl(v);
    Py_RETURN_NONE;
}
static PyObject *py_get_pdl(PyObject *s, PyObject *unused) { return PyBool_FromLong(dg_get_pdl()); }
static PyObject *py_set_ignore_compile_dims(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"new_value", NULL};
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "p:set_ignore_compile_dims", kwl, &v))
        return NULL;
    dg_set_ignore_compile_dims(v);
    Py_RETURN_NONE;
}
static PyObject *py_get_ignore_compile_dims(PyObject *s, PyObject *unused) {
    return PyBool_FromLong(dg_get_ignore_compile_dims());
}
/* DeepGEMM 2.8's switch: every kernel here is deterministic already, so it is accepted and the
 * getter always answers True (see dg_use_deterministic_algorithms). */
static PyObject *py_use_deterministic_algorithms(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"enabled", NULL};
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "p:use_deterministic_algorithms", kwl, &v))
        return NULL;
    dg_use_deterministic_algorithms(v);
    Py_RETURN_NONE;
}
static PyObject *py_get_deterministic_algorithms(PyObject *s, PyObject *unused) {
    return PyBool_FromLong(dg_get_deterministic_algorithms());
}
/* The path report (dg_set_print_paths): mode 0 off, 1 print to stderr and record, 2 record. */
static PyObject *py_set_print_paths(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"mode", NULL};
    PyObject *o;
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_print_paths", kwl, &o) ||
        dgp_int(o, "set_print_paths", "mode", &v))
        return NULL;
    if (v < 0 || v > 2) {
        PyErr_Format(PyExc_ValueError, "set_print_paths: argument 'mode' must be 0, 1 or 2, got %d", v);
        return NULL;
    }
    dg_set_print_paths(v);
    Py_RETURN_NONE;
}
static PyObject *py_get_print_paths(PyObject *s, PyObject *unused) { return PyLong_FromLong(dg_get_print_paths()); }
/* The recorded lines as a list of str. */
static PyObject *py_get_path_report(PyObject *s, PyObject *unused) {
    const size_t need = dg_get_path_report(NULL, 0) + 1;
    char *buf = PyMem_Malloc(need);
    if (!buf)
        return PyErr_NoMemory();
    dg_get_path_report(buf, need);
    PyObject *text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    PyMem_Free(buf);
    if (!text)
        return NULL;
    PyObject *lines = PyUnicode_Splitlines(text, 0);
    Py_DECREF(text);
    return lines;
}
static PyObject *py_clear_path_report(PyObject *s, PyObject *unused) {
    dg_clear_path_report();
    Py_RETURN_NONE;
}
/* new_value: an int (both) or an (m, n) tuple, as DeepGEMM. */
static PyObject *py_set_block_size_multiple_of(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "set_block_size_multiple_of";
    static char *kwl[] = {"new_value", NULL};
    PyObject *o;
    int v[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_block_size_multiple_of", kwl, &o))
        return NULL;
    if (PyLong_Check(o) || PyIndex_Check(o)) {
        if (dgp_int(o, fn, "new_value", &v[0]))
            return NULL;
        v[1] = v[0];
    } else if (dgp_int_tuple(o, fn, "new_value", 2, 0, v, NULL)) {
        return NULL;
    }
    return status_none(dg_set_block_size_multiple_of(v[0], v[1]));
}
static PyObject *py_get_block_size_multiple_of(PyObject *s, PyObject *unused) {
    int m = 0, n = 0;
    dg_get_block_size_multiple_of(&m, &n);
    return Py_BuildValue("(ii)", m, n);
}
static PyObject *py_set_mk_alignment_for_contiguous_layout(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"new_value", NULL};
    PyObject *o;
    int v;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_mk_alignment_for_contiguous_layout", kwl, &o) ||
        dgp_int(o, "set_mk_alignment_for_contiguous_layout", "new_value", &v))
        return NULL;
    return status_none(dg_set_mk_alignment_for_contiguous_layout(v));
}
static PyObject *py_get_mk_alignment_for_contiguous_layout(PyObject *s, PyObject *unused) {
    return PyLong_FromLong(dg_get_mk_alignment_for_contiguous_layout());
}
static PyObject *py_get_theoretical_mk_alignment_for_contiguous_layout(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"expected_m", NULL};
    PyObject *o = Py_None;
    int v = 0, given = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:get_theoretical_mk_alignment_for_contiguous_layout", kwl, &o) ||
        dgp_opt_int(o, "get_theoretical_mk_alignment_for_contiguous_layout", "expected_m", &v, &given))
        return NULL;
    return PyLong_FromLong(dg_get_theoretical_mk_alignment_for_contiguous_layout(given ? v : 0));
}
/* DeepGEMM's JIT initialisation; there is nothing to compile on the CPU. */
static PyObject *py_init(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"library_root_path", "cuda_home_path_by_python", NULL};
    PyObject *a = Py_None, *b = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:init", kwl, &a, &b))
        return NULL;
    Py_RETURN_NONE;
}
/* CPU extras: "reference" forces the scalar reference kernels, "auto" picks the fastest. */
static PyObject *py_set_backend(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"backend", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s:set_backend", kwl, &name))
        return NULL;
    if (strcmp(name, "auto") != 0 && strcmp(name, "reference") != 0) {
        PyErr_Format(PyExc_ValueError, "set_backend: argument 'backend' must be 'auto' or 'reference', got '%s'",
                     name);
        return NULL;
    }
    return status_none(dg_set_backend(strcmp(name, "reference") == 0 ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO));
}
static PyObject *py_get_backend(PyObject *s, PyObject *unused) {
    return PyUnicode_FromString(dg_get_backend() == DG_BACKEND_REFERENCE ? "reference" : "auto");
}
static PyObject *py_get_isa(PyObject *s, PyObject *unused) { return PyUnicode_FromString(dg_isa_name(dg_get_isa())); }
/* CPU extra (C: dg_set_isa; DG_ISA at start-up): caps the instruction set by its get_isa() name.
 * Pre-packed weights (pack_b) are valid for the level they were packed at only. */
static PyObject *py_set_isa(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"isa", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s:set_isa", kwl, &name))
        return NULL;
    for (int level = DG_ISA_GENERIC; level <= DG_ISA_AMX; ++level)
        if (strcmp(name, dg_isa_name((dg_isa)level)) == 0)
            return status_none(dg_set_isa((dg_isa)level));
    PyErr_Format(PyExc_ValueError,
                 "set_isa: argument 'isa' must be one of 'generic', 'avx2', 'avx512', 'avx512_bf16', 'amx', "
                 "got '%s'",
                 name);
    return NULL;
}

/* ---- hyper-connection, einsum -------------------------------------------------------------- */

static PyObject *py_tf32_hc_prenorm_gemm(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "tf32_hc_prenorm_gemm";
    static char *kwl[] = {"a", "b", "d", "sqr_sum", "num_splits", NULL};
    PyObject *a, *b, *d, *sq, *ns = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|O:tf32_hc_prenorm_gemm", kwl, &a, &b, &d, &sq, &ns))
        return NULL;
    dgp_tensor ta, tb, td, ts;
    int splits = 0, given = 0;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(b, fn, "b", 0, &tb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(sq, fn, "sqr_sum", DGP_WRITABLE, &ts) ||
        dgp_opt_int(ns, fn, "num_splits", &splits, &given))
        return NULL;
    if (given && splits <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: argument 'num_splits' must be None or positive, got %d", fn, splits);
        return NULL;
    }
    dg_status st;
    DGP_NOGIL(st, dg_tf32_hc_prenorm_gemm(&ta.t, &tb.t, &td.t, &ts.t, given ? splits : 0));
    return status_none(st);
}

/* A Python float (or anything with __float__, ints included) into a C float. */
static int get_float(PyObject *o, const char *fn, const char *arg, float *out) {
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a float, got %s", fn, arg, Py_TYPE(o)->tp_name);
        }
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* A NumPy array's memory: the data pointer and size of the array at the bottom of its .base
 * chain (the buffer every view of it lies in). 0 on success. */
static int numpy_extent(PyObject *obj, unsigned long long *begin, long long *bytes) {
    PyObject *cur = obj;
    Py_INCREF(cur);
    for (;;) {
        PyObject *base = PyObject_GetAttrString(cur, "base");
        if (!base) {
            Py_DECREF(cur);
            return -1;
        }
        if (base == Py_None || !PyObject_HasAttrString(base, "__array_interface__")) {
            Py_DECREF(base);
            break;
        }
        Py_DECREF(cur);
        cur = base;
    }
    PyObject *ai = PyObject_GetAttrString(cur, "__array_interface__");
    PyObject *nb = PyObject_GetAttrString(cur, "nbytes");
    Py_DECREF(cur);
    PyObject *data = ai ? PyDict_GetItemString(ai, "data") : NULL; /* borrowed */
    int rc = -1;
    if (data && PyTuple_Check(data) && PyTuple_Size(data) >= 1 && nb) {
        *begin = PyLong_AsUnsignedLongLong(PyTuple_GetItem(data, 0));
        *bytes = PyLong_AsLongLong(nb);
        rc = PyErr_Occurred() ? -1 : 0;
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "mega_mhc: argument 'y_shared_sf': cannot read the array's memory extent");
    }
    Py_XDECREF(ai);
    Py_XDECREF(nb);
    return rc;
}

/* y_shared_sf is written at rows beyond its T rows (deepgemm.h): its memory must hold them. For
 * a torch tensor that is its storage, as DeepGEMM checks; for a NumPy array the buffer at the
 * bottom of its .base chain. */
static int check_shared_storage(PyObject *obj, const dg_tensor *t, const dg_tensor *x, int block_m, const char *fn) {
    if (!t || block_m <= 0 || x->ndim != 2 || t->ndim != 2 || x->shape[0] == 0 || t->shape[1] == 0)
        return 0;
    const long long T = x->shape[0], rows = (T + block_m - 1) / block_m * (((long long)block_m + 127) / 128 * 128);
    if (!PyObject_HasAttrString(obj, "untyped_storage")) {
        unsigned long long begin;
        long long bytes;
        if (numpy_extent(obj, &begin, &bytes))
            return -1;
        const unsigned long long at = (unsigned long long)(uintptr_t)t->data;
        const long long need = (rows + (t->shape[1] - 1) * t->strides[1]) * 4;
        if (at < begin || (long long)(at - begin) > bytes || need > bytes - (long long)(at - begin)) {
            PyErr_Format(PyExc_ValueError,
                         "%s: argument 'y_shared_sf': its array's memory holds %lld bytes from the view's start, the "
                         "shared-expert layout needs %lld (%lld rows per column)",
                         fn, at >= begin ? bytes - (long long)(at - begin) : 0LL, need, rows);
            return -1;
        }
        return 0;
    }
    PyObject *st = PyObject_CallMethod(obj, "untyped_storage", NULL);
    PyObject *nb = st ? PyObject_CallMethod(st, "nbytes", NULL) : NULL;
    Py_XDECREF(st);
    if (!nb)
        return -1;
    PyObject *off = PyObject_CallMethod(obj, "storage_offset", NULL);
    if (!off) {
        Py_DECREF(nb);
        return -1;
    }
    const long long bytes = PyLong_AsLongLong(nb), first = PyLong_AsLongLong(off);
    Py_DECREF(nb);
    Py_DECREF(off);
    if (PyErr_Occurred())
        return -1;
    const long long need = (first + rows + (t->shape[1] - 1) * t->strides[1]) * 4;
    if (rows > 0 && need > bytes) {
        PyErr_Format(PyExc_ValueError,
                     "%s: argument 'y_shared_sf': its storage holds %lld bytes, the shared-expert layout needs %lld "
                     "(%lld rows per column)", fn, bytes, need, rows);
        return -1;
    }
    return 0;
}

static PyObject *py_mega_mhc(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "mega_mhc";
    static char *kwl[] = {"x", "residual", "shifted_prev_mix", "post_mix", "comb_res_mix", "fn", "mix_scales",
                          "mix_bases", "hc_mult", "hc_norm_eps", "hc_pre_eps", "hc_post_scale", "sinkhorn_eps",
                          "num_sinkhorn_iters", "rmsnorm_weight", "rmsnorm_eps", "rmsnorm_scale", "new_residual",
                          "new_prev_mix", "new_post_mix", "new_comb_res_mix", "y_bf16", "y_fp8", "y_gemm_sf",
                          "y_routed_sf", "y_shared_sf", "shared_sf_block_m", NULL};
    PyObject *o[27];
    for (int i = 21; i < 26; ++i)
        o[i] = Py_None;
    o[26] = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOOOOOOOOOOO|OOOOOO:mega_mhc", kwl, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13],
                                     &o[14], &o[15], &o[16], &o[17], &o[18], &o[19], &o[20], &o[21], &o[22], &o[23],
                                     &o[24], &o[25], &o[26]))
        return NULL;
    /* tensors by position; optional ones may be None */
    static const int tensor_idx[] = {0, 1, 2, 3, 4, 5, 6, 7, 14, 17, 18, 19, 20, 21, 22, 23, 24, 25};
    enum { NT = sizeof tensor_idx / sizeof tensor_idx[0] };
    dgp_tensor t[NT];
    for (int i = 0; i < NT; ++i) {
        const int k = tensor_idx[i];
        const int optional = k == 2 || k == 18 || k >= 21;
        const int writable = k >= 17;
        if (dgp_tensor_from(o[k], fn, kwl[k], (optional ? DGP_OPTIONAL : 0) | (writable ? DGP_WRITABLE : 0), &t[i]))
            return NULL;
    }
    int hc_mult, iters, block_m = 0;
    float f[6];
    static const int float_idx[] = {9, 10, 11, 12, 15, 16};
    if (dgp_int(o[8], fn, "hc_mult", &hc_mult) || dgp_int(o[13], fn, "num_sinkhorn_iters", &iters) ||
        (o[26] && dgp_int(o[26], fn, "shared_sf_block_m", &block_m)))
        return NULL;
    for (int i = 0; i < 6; ++i)
        if (get_float(o[float_idx[i]], fn, kwl[float_idx[i]], &f[i]))
            return NULL;
    if (check_shared_storage(o[25], dgp_ptr(&t[17]), &t[0].t, block_m, fn))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_mega_mhc(&t[0].t, &t[1].t, dgp_ptr(&t[2]), &t[3].t, &t[4].t, &t[5].t, &t[6].t, &t[7].t, hc_mult,
                              f[0], f[1], f[2], f[3], iters, &t[8].t, f[4], f[5], &t[9].t, dgp_ptr(&t[10]), &t[11].t,
                              &t[12].t, dgp_ptr(&t[13]), dgp_ptr(&t[14]), dgp_ptr(&t[15]), dgp_ptr(&t[16]),
                              dgp_ptr(&t[17]), block_m));
    return status_none(st);
}

static PyObject *py_einsum(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "einsum";
    static char *kwl[] = {"expr", "a", "b", "d", "c", "use_cublaslt", NULL};
    const char *expr;
    PyObject *a, *b, *d, *c = Py_None;
    int use_cublaslt = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOO|Op:einsum", kwl, &expr, &a, &b, &d, &c, &use_cublaslt))
        return NULL;
    dgp_tensor ta, tb, td, tc;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(b, fn, "b", 0, &tb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_einsum(expr, &ta.t, &tb.t, &td.t, dgp_ptr(&tc)));
    return status_none(st);
}

static PyObject *py_fp8_einsum(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "fp8_einsum";
    static char *kwl[] = {"expr", "a", "b", "d", "c", "recipe", NULL};
    const char *expr;
    PyObject *a, *b, *d, *c = Py_None, *recipe = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOO|OO:fp8_einsum", kwl, &expr, &a, &b, &d, &c, &recipe))
        return NULL;
    dgp_tensor ta, sfa, tb, sfb, td, tc;
    int r[3] = {1, 128, 128}, given = 0;
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || dgp_pair_from(b, fn, "b", 0, &tb, &sfb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc) ||
        dgp_int_tuple(recipe, fn, "recipe", 3, 1, r, &given))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_fp8_einsum(expr, &ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, dgp_ptr(&tc), r));
    return status_none(st);
}

/* ---- scale-factor layouts ------------------------------------------------------------------ */

static PyObject *py_get_tma_aligned_size(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_tma_aligned_size";
    static char *kwl[] = {"x", "element_size", NULL};
    PyObject *xo, *eo;
    int x, es, out = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:get_tma_aligned_size", kwl, &xo, &eo) ||
        dgp_int(xo, fn, "x", &x) || dgp_int(eo, fn, "element_size", &es))
        return NULL;
    dg_status st = dg_get_tma_aligned_size(x, es, &out);
    return st == DG_OK ? PyLong_FromLong(out) : dgp_raise(st);
}

/* Query, allocate like `like`, fill: the pattern of every layout function. `call` is evaluated
 * twice (query under the GIL, then the real call without it). */
#define DGP_QUERY_ALLOC_FILL(like, out, call)                 \
    do {                                                      \
        dg_status st_ = (call);                               \
        if (st_ != DG_OK)                                     \
            return dgp_raise(st_);                            \
        PyObject *res_ = dgp_alloc((like), &(out));           \
        if (!res_)                                            \
            return NULL;                                      \
        DGP_NOGIL(st_, call);                                 \
        if (st_ != DG_OK) {                                   \
            Py_DECREF(res_);                                  \
            return dgp_raise(st_);                            \
        }                                                     \
        return res_;                                          \
    } while (0)

static PyObject *py_get_mn_major_tma_aligned_tensor(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"sf", NULL};
    PyObject *sf;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:get_mn_major_tma_aligned_tensor", kwl, &sf))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(sf, "get_mn_major_tma_aligned_tensor", "sf", 0, &t))
        return NULL;
    dg_tensor out = {0};
    DGP_QUERY_ALLOC_FILL(sf, out, dg_get_mn_major_tma_aligned_tensor(&t.t, &out));
}

static PyObject *py_get_mn_major_tma_aligned_packed_ue8m0_tensor(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_mn_major_tma_aligned_packed_ue8m0_tensor";
    static char *kwl[] = {"sf", "psum_layout", NULL};
    PyObject *sf, *psum = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:get_mn_major_tma_aligned_packed_ue8m0_tensor", kwl, &sf, &psum))
        return NULL;
    dgp_tensor t, tp;
    if (dgp_tensor_from(sf, fn, "sf", 0, &t) || dgp_tensor_from(psum, fn, "psum_layout", DGP_OPTIONAL, &tp))
        return NULL;
    dg_tensor out = {0};
    DGP_QUERY_ALLOC_FILL(sf, out, dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&t.t, dgp_ptr(&tp), &out));
}

static PyObject *py_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor";
    static char *kwl[] = {"sf", "grouped_layout", "ks_cpu", "gran_k", "k_alignment", "use_psum_layout", NULL};
    PyObject *sf, *layout, *ks_obj, *gran_obj, *align_obj;
    int gran_k, k_alignment, use_psum = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|p:get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", kwl,
                                     &sf, &layout, &ks_obj, &gran_obj, &align_obj, &use_psum) ||
        dgp_int(gran_obj, fn, "gran_k", &gran_k) || dgp_int(align_obj, fn, "k_alignment", &k_alignment))
        return NULL;
    dgp_tensor t, tl;
    int *ks = NULL, num_ks = 0;
    if (dgp_tensor_from(sf, fn, "sf", 0, &t) || dgp_tensor_from(layout, fn, "grouped_layout", 0, &tl) ||
        dgp_int_list(ks_obj, fn, "ks_cpu", &ks, &num_ks))
        return NULL;
    dg_tensor out = {0};
    PyObject *res = NULL;
    dg_status st = dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&t.t, &tl.t, ks, num_ks, gran_k,
                                                                             k_alignment, use_psum, &out);
    if (st != DG_OK)
        dgp_raise(st);
    else if ((res = dgp_alloc(sf, &out)) != NULL) {
        DGP_NOGIL(st, dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&t.t, &tl.t, ks, num_ks, gran_k,
                                                                                k_alignment, use_psum, &out));
        if (st != DG_OK) {
            Py_CLEAR(res);
            dgp_raise(st);
        }
    }
    PyMem_Free(ks);
    return res;
}

static PyObject *py_transform_sf_into_required_layout(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "transform_sf_into_required_layout";
    static char *kwl[] = {"sf", "mn", "k", "recipe", "num_groups", "is_sfa", "disable_ue8m0_cast", "psum_layout",
                          NULL};
    PyObject *sf, *mn_obj, *k_obj, *recipe, *ng = Py_None, *is_sfa = Py_None, *psum = Py_None;
    int64_t mn, k;
    int disable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOpO:transform_sf_into_required_layout", kwl, &sf, &mn_obj,
                                     &k_obj, &recipe, &ng, &is_sfa, &disable, &psum) ||
        dgp_int64(mn_obj, fn, "mn", &mn) || dgp_int64(k_obj, fn, "k", &k))
        return NULL;
    int r[3], len = (PyTuple_Check(recipe) || PyList_Check(recipe)) ? (int)PySequence_Size(recipe) : -1;
    if (len != 2 && len != 3) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'recipe' must be a tuple of 2 or 3 ints", fn);
        return NULL;
    }
    dgp_tensor t, tp;
    int groups = 0, groups_given = 0;
    if (dgp_int_tuple(recipe, fn, "recipe", len, 0, r, NULL) || dgp_opt_int(ng, fn, "num_groups", &groups, &groups_given) ||
        dgp_tensor_from(sf, fn, "sf", 0, &t) || dgp_tensor_from(psum, fn, "psum_layout", DGP_OPTIONAL, &tp))
        return NULL;
    int sfa = is_sfa == Py_None ? -1 : PyObject_IsTrue(is_sfa);
    if (sfa < -1)
        return NULL;
    if (groups_given && groups <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: argument 'num_groups' must be None or positive, got %d", fn, groups);
        return NULL;
    }
    dg_tensor out = {0};
    DGP_QUERY_ALLOC_FILL(sf, out, dg_transform_sf_into_required_layout(&t.t, mn, k, r, len, groups_given ? groups : 0,
                                                                       sfa, disable, dgp_ptr(&tp), &out));
}

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
#define M0(name, doc) {#name, py_##name, METH_NOARGS, doc}
PyMethodDef dgp_misc_methods[] = {
    M(set_num_sms, "set_num_sms(new_num_sms): threads the kernels use"),
    M0(get_num_sms, "get_num_sms() -> threads the kernels use"),
    M(set_tc_util, "set_tc_util(new_tc_util): accepted, no effect on a CPU"),
    M0(get_tc_util, "get_tc_util()"),
    M(set_pdl, "set_pdl(new_enable_pdl): accepted, no effect on a CPU"),
    M0(get_pdl, "get_pdl()"),
    M(set_ignore_compile_dims,
      "set_ignore_compile_dims(new_value): the runtime JIT compiles no dimension in as a constant (same results)"),
    M0(get_ignore_compile_dims, "get_ignore_compile_dims()"),
    M(use_deterministic_algorithms, "use_deterministic_algorithms(enabled): accepted; results are always "
                                    "deterministic here"),
    M0(get_deterministic_algorithms, "get_deterministic_algorithms() -> True (always deterministic here)"),
    M(set_print_paths, "set_print_paths(mode): path report; 0 off, 1 print each new path to stderr, 2 record only "
                       "(DG_PRINT_PATHS)"),
    M0(get_print_paths, "get_print_paths() -> the path report's mode"),
    M0(get_path_report, "get_path_report() -> list of str: which path served each kind of call since the last clear"),
    M0(clear_path_report, "clear_path_report(): forget the recorded paths"),
    M(set_block_size_multiple_of, "set_block_size_multiple_of(new_value): int or (m, n)"),
    M0(get_block_size_multiple_of, "get_block_size_multiple_of() -> (m, n)"),
    M(set_mk_alignment_for_contiguous_layout, "set_mk_alignment_for_contiguous_layout(new_value)"),
    M0(get_mk_alignment_for_contiguous_layout, "get_mk_alignment_for_contiguous_layout()"),
    M(get_theoretical_mk_alignment_for_contiguous_layout,
      "get_theoretical_mk_alignment_for_contiguous_layout(expected_m=None)"),
    M(init, "init(library_root_path, cuda_home_path_by_python): no-op (no JIT on a CPU)"),
    M(set_backend, "set_backend('auto' | 'reference') (CPU only)"),
    M0(get_backend, "get_backend() -> 'auto' or 'reference' (CPU only)"),
    M0(get_isa, "get_isa() -> the instruction set the kernels use (CPU only)"),
    M(set_isa, "set_isa('generic' | 'avx2' | 'avx512' | 'avx512_bf16' | 'amx'): caps the instruction set "
               "(CPU only; a level above the CPU's raises NotImplementedError)"),
    M(tf32_hc_prenorm_gemm, "tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)"),
    M(mega_mhc, "mega_mhc(x, residual, shifted_prev_mix, post_mix, comb_res_mix, fn, mix_scales, mix_bases, "
                "hc_mult, hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, rmsnorm_weight, "
                "rmsnorm_eps, rmsnorm_scale, new_residual, new_prev_mix, new_post_mix, new_comb_res_mix, y_bf16=None, "
                "y_fp8=None, y_gemm_sf=None, y_routed_sf=None, y_shared_sf=None, shared_sf_block_m=0)"),
    M(einsum, "einsum(expr, a, b, d, c=None, use_cublaslt=False)"),
    M(fp8_einsum, "fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)); a, b are (data, scales)"),
    M(get_tma_aligned_size, "get_tma_aligned_size(x, element_size) -> int"),
    M(get_mn_major_tma_aligned_tensor, "get_mn_major_tma_aligned_tensor(sf) -> new tensor"),
    M(get_mn_major_tma_aligned_packed_ue8m0_tensor,
      "get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout=None) -> new int32 tensor"),
    M(get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
      "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, grouped_layout, ks_cpu, gran_k, k_alignment, "
      "use_psum_layout=False) -> new int32 tensor"),
    M(transform_sf_into_required_layout,
      "transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=None, "
      "disable_ue8m0_cast=False, psum_layout=None) -> new tensor"),
    {NULL, NULL, 0, NULL},
};

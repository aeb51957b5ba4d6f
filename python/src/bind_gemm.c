/*
 * bind_gemm.c - dense GEMMs: bf16_gemm_*, fp8_fp4_gemm_* (fp8_gemm_* are aliases, as in
 * DeepGEMM), fp8_gemm_nt_skip_head_mid, the cuBLASLt GEMMs (NVFP4 and batched_syrk / batched_symm too). The `_nt`
 * forms also take pre-packed weights (a PackedB from pack_b, bind_packed.c) as b.
 * Argument names, order and defaults are DeepGEMM's (csrc/apis/gemm.hpp, attention.hpp).
 */
#include "dgpy.h"

int dgp_gemm_opts(const char *fn, PyObject *recipe, PyObject *recipe_a, PyObject *recipe_b,
                  const char *compiled_dims, int disable_ue8m0_cast, dg_gemm_options *opts) {
    *opts = dg_gemm_options_default();
    if (dgp_int_tuple(recipe, fn, "recipe", 3, 1, opts->recipe, NULL) ||
        dgp_int_tuple(recipe_a, fn, "recipe_a", 2, 1, opts->recipe_a, NULL) ||
        dgp_int_tuple(recipe_b, fn, "recipe_b", 2, 1, opts->recipe_b, NULL))
        return -1;
    opts->compiled_dims = compiled_dims;
    opts->disable_ue8m0_cast = disable_ue8m0_cast;
    return 0;
}

/* DeepGEMM 2.8's alpha=None | float into opts (has_alpha). */
static int dgp_alpha(PyObject *alpha, const char *fn, dg_gemm_options *opts) {
    if (alpha == Py_None)
        return 0;
    if (!PyFloat_Check(alpha) && !PyLong_Check(alpha)) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'alpha' must be a float or None", fn);
        return -1;
    }
    const double v = PyFloat_AsDouble(alpha);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    opts->has_alpha = 1;
    opts->alpha = (float)v;
    return 0;
}

typedef dg_status (*bf16_gemm_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                                  const dg_gemm_options *);
typedef dg_status (*fp8_gemm_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                                 const dg_tensor *, const dg_tensor *, const dg_gemm_options *);
/* The same with pre-packed weights (bind_packed.c's PackedB as b); only the `_nt` forms have them. */
typedef dg_status (*bf16_packed_fn)(const dg_tensor *, const dg_packed_b *, const dg_tensor *, const dg_tensor *);
typedef dg_status (*fp8_packed_fn)(const dg_tensor *, const dg_tensor *, const dg_packed_b *, const dg_tensor *,
                                   const dg_tensor *, const dg_gemm_options *);

static PyObject *bf16_gemm(PyObject *args, PyObject *kw, const char *fn, bf16_gemm_fn call,
                           bf16_packed_fn packed_call, const char *dims) {
    static char *kwlist[] = {"a", "b", "d", "c", "compiled_dims", "alpha", NULL};
    PyObject *a, *b, *d, *c = Py_None, *alpha = Py_None;
    const char *compiled_dims = dims;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "OOO|OsO:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a, &b, &d, &c, &compiled_dims, &alpha))
        return NULL;
    const int packed = packed_call && dgp_is_packed(b);
    dg_gemm_options opts = dg_gemm_options_default();
    opts.compiled_dims = compiled_dims;
    if (dgp_alpha(alpha, fn, &opts))
        return NULL;
    if (packed && opts.has_alpha) {
        PyErr_Format(PyExc_ValueError, "%s: argument 'alpha' is not supported with pre-packed BF16 weights", fn);
        return NULL;
    }
    dgp_tensor ta, tb, td, tc;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || (!packed && dgp_tensor_from(b, fn, "b", 0, &tb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 0, 0, NULL, &pb))
            return NULL;
        DGP_NOGIL(st, packed_call(&ta.t, pb, &td.t, dgp_ptr(&tc)));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, call(&ta.t, &tb.t, &td.t, dgp_ptr(&tc), &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *fp8_fp4_gemm(PyObject *args, PyObject *kw, const char *fn, fp8_gemm_fn call,
                              fp8_packed_fn packed_call, const char *dims) {
    static char *kwlist[] = {"a", "b", "d", "c", "recipe", "recipe_a", "recipe_b", "compiled_dims",
                             "disable_ue8m0_cast", "alpha", NULL};
    PyObject *a, *b, *d, *c = Py_None, *recipe = Py_None, *recipe_a = Py_None, *recipe_b = Py_None;
    PyObject *alpha = Py_None;
    const char *compiled_dims = dims;
    int disable = 0;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "OOO|OOOOspO:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a, &b, &d, &c, &recipe, &recipe_a, &recipe_b,
                                     &compiled_dims, &disable, &alpha))
        return NULL;
    const int packed = packed_call && dgp_is_packed(b);
    dgp_tensor ta, sfa, tb, sfb, td, tc;
    dg_gemm_options opts;
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || (!packed && dgp_pair_from(b, fn, "b", 0, &tb, &sfb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc) ||
        dgp_gemm_opts(fn, recipe, recipe_a, recipe_b, compiled_dims, disable, &opts) || dgp_alpha(alpha, fn, &opts))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 1, 0, &opts, &pb))
            return NULL;
        DGP_NOGIL(st, packed_call(&ta.t, &sfa.t, pb, &td.t, dgp_ptr(&tc), &opts));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, call(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, dgp_ptr(&tc), &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

#define DGP_BF16(L, PACKED, DIMS)                                                                \
    static PyObject *py_bf16_gemm_##L(PyObject *self, PyObject *args, PyObject *kw) {            \
        return bf16_gemm(args, kw, "bf16_gemm_" #L, dg_bf16_gemm_##L##_ex, PACKED, DIMS);             \
    }
#define DGP_FP8(L, PACKED, DIMS)                                                                 \
    static PyObject *py_fp8_fp4_gemm_##L(PyObject *self, PyObject *args, PyObject *kw) {         \
        return fp8_fp4_gemm(args, kw, "fp8_fp4_gemm_" #L, dg_fp8_fp4_gemm_##L, PACKED, DIMS);    \
    }
DGP_BF16(nt, dg_bf16_gemm_nt_packed, "nk")
DGP_BF16(nn, NULL, "nk")
DGP_BF16(tn, NULL, "mn")
DGP_BF16(tt, NULL, "mn")
DGP_FP8(nt, dg_fp8_fp4_gemm_nt_packed, "nk")
DGP_FP8(nn, NULL, "nk")
DGP_FP8(tn, NULL, "mn")
DGP_FP8(tt, NULL, "mn")

static PyObject *py_fp8_gemm_nt_skip_head_mid(PyObject *self, PyObject *args, PyObject *kw) {
    static const char *fn = "fp8_gemm_nt_skip_head_mid";
    static char *kwlist[] = {"a", "b", "d", "head_splits", "recipe", "compiled_dims", "disable_ue8m0_cast", NULL};
    PyObject *a, *b, *d, *splits, *recipe = Py_None;
    const char *compiled_dims = "nk";
    int disable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|Osp:fp8_gemm_nt_skip_head_mid", kwlist, &a, &b, &d, &splits,
                                     &recipe, &compiled_dims, &disable))
        return NULL;
    dgp_tensor ta, sfa, tb, sfb, td;
    dg_gemm_options opts;
    int hs[3];
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || dgp_pair_from(b, fn, "b", 0, &tb, &sfb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_int_tuple(splits, fn, "head_splits", 3, 0, hs, NULL) ||
        dgp_gemm_opts(fn, recipe, Py_None, Py_None, compiled_dims, disable, &opts))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_fp8_gemm_nt_skip_head_mid(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, hs, &opts));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

/* cuBLASLt GEMMs (DeepGEMM 2.8): cublaslt_gemm_xx(a, b, d, c=None), plain D = C + A @ B^T on
 * BF16, unscaled FP8 or FLOAT32 operands (include/deepgemm.h, dg_cublaslt_gemm_*). */
typedef dg_status (*cublaslt_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *);

static PyObject *cublaslt_gemm(PyObject *args, PyObject *kw, const char *fn, cublaslt_fn call) {
    static char *kwlist[] = {"a", "b", "d", "c", NULL};
    PyObject *a, *b, *d, *c = Py_None;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "OOO|O:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a, &b, &d, &c))
        return NULL;
    dgp_tensor ta, tb, td, tc;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(b, fn, "b", 0, &tb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, call(&ta.t, &tb.t, &td.t, dgp_ptr(&tc)));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

#define DGP_CUBLASLT(L)                                                                          \
    static PyObject *py_cublaslt_gemm_##L(PyObject *self, PyObject *args, PyObject *kw) {        \
        return cublaslt_gemm(args, kw, "cublaslt_gemm_" #L, dg_cublaslt_gemm_##L);               \
    }
DGP_CUBLASLT(nt)
DGP_CUBLASLT(nn)
DGP_CUBLASLT(tn)
DGP_CUBLASLT(tt)

/* cublaslt_nvfp4_gemm_nt((a, sfa), (b, sfb), d, c=None): NVFP4 codes with VEC16 UE4M3 scales. */
static PyObject *py_cublaslt_nvfp4_gemm_nt(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"a", "b", "d", "c", NULL};
    static const char *fn = "cublaslt_nvfp4_gemm_nt";
    PyObject *a, *b, *d, *c = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:cublaslt_nvfp4_gemm_nt", kwlist, &a, &b, &d, &c))
        return NULL;
    dgp_tensor ta, sfa, tb, sfb, td, tc;
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || dgp_pair_from(b, fn, "b", 0, &tb, &sfb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_cublaslt_nvfp4_gemm_nt(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, dgp_ptr(&tc)));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

/* batched_syrk(a, d) and batched_symm(a, b, d): DeepGEMM 2.8's batched cuBLASLt calls. */
static PyObject *py_batched_syrk(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"a", "d", NULL};
    static const char *fn = "batched_syrk";
    PyObject *a, *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:batched_syrk", kwlist, &a, &d))
        return NULL;
    dgp_tensor ta, td;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_batched_syrk(&ta.t, &td.t));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_batched_symm(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"a", "b", "d", NULL};
    static const char *fn = "batched_symm";
    PyObject *a, *b, *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:batched_symm", kwlist, &a, &b, &d))
        return NULL;
    dgp_tensor ta, tb, td;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(b, fn, "b", 0, &tb) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_batched_symm(&ta.t, &tb.t, &td.t));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
PyMethodDef dgp_gemm_methods[] = {
    M(bf16_gemm_nt, "bf16_gemm_nt(a, b, d, c=None, compiled_dims='nk', alpha=None): d = c + alpha * (a @ b.T), a [M, K], "
                    "b [N, K] or pack_b(b) (then no alpha)"),
    M(bf16_gemm_nn, "bf16_gemm_nn(a, b, d, c=None, compiled_dims='nk', alpha=None): d = c + alpha * (a @ b), b [K, N]"),
    M(bf16_gemm_tn, "bf16_gemm_tn(a, b, d, c=None, compiled_dims='mn', alpha=None): d = c + alpha * (a.T @ b), a [K, M], b [K, N]"),
    M(bf16_gemm_tt, "bf16_gemm_tt(a, b, d, c=None, compiled_dims='mn', alpha=None): d = c + alpha * (a.T @ b.T)"),
    M(fp8_fp4_gemm_nt, "fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, "
                       "compiled_dims='nk', disable_ue8m0_cast=False, alpha=None): d = c + alpha * (a @ b.T); a, b are (data, scales), b may be "
                       "pack_b((data, scales), recipe...)"),
    M(fp8_fp4_gemm_nn, "fp8_fp4_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, "
                       "compiled_dims='nk', disable_ue8m0_cast=False, alpha=None)"),
    M(fp8_fp4_gemm_tn, "fp8_fp4_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, "
                       "compiled_dims='mn', disable_ue8m0_cast=False, alpha=None)"),
    M(fp8_fp4_gemm_tt, "fp8_fp4_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, "
                       "compiled_dims='mn', disable_ue8m0_cast=False, alpha=None)"),
    M(fp8_gemm_nt_skip_head_mid, "fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, recipe=None, "
                                 "compiled_dims='nk', disable_ue8m0_cast=False)"),
    M(cublaslt_gemm_nt, "cublaslt_gemm_nt(a, b, d, c=None): d = c + a @ b.T, a [M, K], b [N, K]; BF16, FP8 "
                        "(unscaled) or float32 (d float32) operands"),
    M(cublaslt_gemm_nn, "cublaslt_gemm_nn(a, b, d, c=None): d = c + a @ b, b [K, N]"),
    M(cublaslt_gemm_tn, "cublaslt_gemm_tn(a, b, d, c=None): d = c + a.T @ b, a [K, M], b [K, N]"),
    M(cublaslt_gemm_tt, "cublaslt_gemm_tt(a, b, d, c=None): d = c + a.T @ b.T, a [K, M]"),
    M(cublaslt_nvfp4_gemm_nt, "cublaslt_nvfp4_gemm_nt(a, b, d, c=None): d = c + a @ b.T, a = (codes [M, K/2] int8, "
                              "UE4M3 scales uint8 in cuBLASLt's VEC16 layout), b likewise [N, K/2]; K % 32 == 0"),
    M(batched_syrk, "batched_syrk(a, d): d[g] = a[g] @ a[g].mT, a [(G,) M, K], d [(G,) M, M]; BF16 or float32, d a's dtype"),
    M(batched_symm, "batched_symm(a, b, d): d[g] = a[g] @ b[g], a [(G,) M, M] symmetric, b and d [(G,) M, K]"),
    {NULL, NULL, 0, NULL},
};

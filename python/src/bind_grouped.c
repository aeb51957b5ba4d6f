/*
 * bind_grouped.c - m-grouped (contiguous, masked) and k-grouped GEMMs, with DeepGEMM's argument
 * names and defaults (csrc/apis/gemm.hpp). The m_grouped_fp8_gemm_* names are aliases set up in
 * module.c, as DeepGEMM does. The m-grouped `_nt` forms also take grouped pre-packed weights (a
 * PackedB from pack_b on [G, N, K], bind_packed.c) as b.
 */
#include "dgpy.h"

typedef dg_status (*mgc_bf16_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                                 const dg_gemm_options *);
typedef dg_status (*mgc_fp8_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                                const dg_tensor *, const dg_tensor *, const dg_gemm_options *);
/* The same with pre-packed weights; the `_nn` forms have none (NULL). */
typedef dg_status (*mgc_bf16_packed_fn)(const dg_tensor *, const dg_packed_b *, const dg_tensor *, const dg_tensor *,
                                        const dg_gemm_options *);
typedef dg_status (*mgc_fp8_packed_fn)(const dg_tensor *, const dg_tensor *, const dg_packed_b *, const dg_tensor *,
                                       const dg_tensor *, const dg_gemm_options *);

/* The psum keyword arguments; expected_m may be NULL for the `_nn` forms (DeepGEMM has none). */
static int psum_opts(const char *fn, int use_psum, int ensure_zero, PyObject *expected_m, dg_gemm_options *o) {
    int v = 0, given = 0;
    if (dgp_opt_int(expected_m, fn, "expected_m_for_psum_layout", &v, &given))
        return -1;
    o->use_psum_layout = use_psum;
    o->ensure_zero_padding = ensure_zero;
    o->expected_m_for_psum_layout = given ? v : 0;
    if (given && v <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: argument 'expected_m_for_psum_layout' must be positive, got %d", fn, v);
        return -1;
    }
    return 0;
}

static PyObject *mgc_bf16(PyObject *args, PyObject *kw, const char *fn, mgc_bf16_fn call,
                          mgc_bf16_packed_fn packed_call, int has_expected) {
    static char *kw_nt[] = {"a", "b", "d", "grouped_layout", "compiled_dims", "use_psum_layout",
                            "ensure_zero_padding", "expected_m_for_psum_layout", NULL};
    static char *kw_nn[] = {"a", "b", "d", "grouped_layout", "compiled_dims", "use_psum_layout",
                            "ensure_zero_padding", NULL};
    PyObject *a, *b, *d, *layout, *expected = Py_None;
    const char *dims = "nk";
    int use_psum = 0, ensure_zero = 1;
    char fmt[80];
    snprintf(fmt, sizeof fmt, "OOOO|spp%s:%s", has_expected ? "O" : "", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, has_expected ? kw_nt : kw_nn, &a, &b, &d, &layout, &dims, &use_psum, &ensure_zero,
                                     &expected))
        return NULL;
    const int packed = packed_call && dgp_is_packed(b);
    dgp_tensor ta, tb, td, tl;
    dg_gemm_options opts = dg_gemm_options_default();
    opts.compiled_dims = dims;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || (!packed && dgp_tensor_from(b, fn, "b", 0, &tb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(layout, fn, "grouped_layout", 0, &tl) ||
        psum_opts(fn, use_psum, ensure_zero, expected, &opts))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 0, 1, &opts, &pb))
            return NULL;
        DGP_NOGIL(st, packed_call(&ta.t, pb, &td.t, &tl.t, &opts));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, call(&ta.t, &tb.t, &td.t, &tl.t, &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *mgc_fp8(PyObject *args, PyObject *kw, const char *fn, mgc_fp8_fn call,
                         mgc_fp8_packed_fn packed_call, int has_expected) {
    static char *kwl[] = {"a", "b", "d", "grouped_layout", "recipe", "recipe_a", "recipe_b", "compiled_dims",
                          "disable_ue8m0_cast", "use_psum_layout", "ensure_zero_padding",
                          "expected_m_for_psum_layout", NULL};
    static char *kwl_nn[] = {"a", "b", "d", "grouped_layout", "recipe", "recipe_a", "recipe_b", "compiled_dims",
                             "disable_ue8m0_cast", "use_psum_layout", "ensure_zero_padding", NULL};
    PyObject *a, *b, *d, *layout, *recipe = Py_None, *recipe_a = Py_None, *recipe_b = Py_None, *expected = Py_None;
    const char *dims = "nk";
    int disable = 0, use_psum = 0, ensure_zero = 1;
    char fmt[80];
    snprintf(fmt, sizeof fmt, "OOOO|OOOsppp%s:%s", has_expected ? "O" : "", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, has_expected ? kwl : kwl_nn, &a, &b, &d, &layout, &recipe, &recipe_a, &recipe_b, &dims,
                                     &disable, &use_psum, &ensure_zero, &expected))
        return NULL;
    const int packed = packed_call && dgp_is_packed(b);
    dgp_tensor ta, sfa, tb, sfb, td, tl;
    dg_gemm_options opts;
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || (!packed && dgp_pair_from(b, fn, "b", 0, &tb, &sfb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(layout, fn, "grouped_layout", 0, &tl) ||
        dgp_gemm_opts(fn, recipe, recipe_a, recipe_b, dims, disable, &opts) ||
        psum_opts(fn, use_psum, ensure_zero, expected, &opts))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 1, 1, &opts, &pb))
            return NULL;
        DGP_NOGIL(st, packed_call(&ta.t, &sfa.t, pb, &td.t, &tl.t, &opts));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, call(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, &tl.t, &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_m_grouped_bf16_gemm_nt_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return mgc_bf16(args, kw, "m_grouped_bf16_gemm_nt_contiguous", dg_m_grouped_bf16_gemm_nt_contiguous,
                    dg_m_grouped_bf16_gemm_nt_contiguous_packed, 1);
}
static PyObject *py_m_grouped_bf16_gemm_nn_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return mgc_bf16(args, kw, "m_grouped_bf16_gemm_nn_contiguous", dg_m_grouped_bf16_gemm_nn_contiguous, NULL,
                    0);
}
static PyObject *py_m_grouped_fp8_fp4_gemm_nt_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return mgc_fp8(args, kw, "m_grouped_fp8_fp4_gemm_nt_contiguous", dg_m_grouped_fp8_fp4_gemm_nt_contiguous,
                   dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed, 1);
}
static PyObject *py_m_grouped_fp8_fp4_gemm_nn_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return mgc_fp8(args, kw, "m_grouped_fp8_fp4_gemm_nn_contiguous", dg_m_grouped_fp8_fp4_gemm_nn_contiguous, NULL,
                   0);
}

static PyObject *py_m_grouped_bf16_gemm_nt_masked(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "m_grouped_bf16_gemm_nt_masked";
    static char *kwl[] = {"a", "b", "d", "masked_m", "expected_m", "compiled_dims", NULL};
    PyObject *a, *b, *d, *masked, *expected_obj;
    int expected_m;
    const char *dims = "nk";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|s:m_grouped_bf16_gemm_nt_masked", kwl, &a, &b, &d, &masked,
                                     &expected_obj, &dims) ||
        dgp_int(expected_obj, fn, "expected_m", &expected_m))
        return NULL;
    const int packed = dgp_is_packed(b);
    dgp_tensor ta, tb, td, tm;
    dg_gemm_options opts = dg_gemm_options_default();
    opts.compiled_dims = dims;
    if (dgp_tensor_from(a, fn, "a", 0, &ta) || (!packed && dgp_tensor_from(b, fn, "b", 0, &tb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(masked, fn, "masked_m", 0, &tm))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 0, 1, &opts, &pb))
            return NULL;
        DGP_NOGIL(st, dg_m_grouped_bf16_gemm_nt_masked_packed(&ta.t, pb, &td.t, &tm.t, expected_m, &opts));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, dg_m_grouped_bf16_gemm_nt_masked(&ta.t, &tb.t, &td.t, &tm.t, expected_m, &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_m_grouped_fp8_fp4_gemm_nt_masked(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "m_grouped_fp8_fp4_gemm_nt_masked";
    static char *kwl[] = {"a", "b", "d", "masked_m", "expected_m", "recipe", "recipe_a", "recipe_b",
                          "compiled_dims", "disable_ue8m0_cast", NULL};
    PyObject *a, *b, *d, *masked, *expected_obj, *recipe = Py_None, *recipe_a = Py_None, *recipe_b = Py_None;
    int expected_m, disable = 0;
    const char *dims = "nk";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|OOOsp:m_grouped_fp8_fp4_gemm_nt_masked", kwl, &a, &b, &d,
                                     &masked, &expected_obj, &recipe, &recipe_a, &recipe_b, &dims, &disable) ||
        dgp_int(expected_obj, fn, "expected_m", &expected_m))
        return NULL;
    const int packed = dgp_is_packed(b);
    dgp_tensor ta, sfa, tb, sfb, td, tm;
    dg_gemm_options opts;
    if (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || (!packed && dgp_pair_from(b, fn, "b", 0, &tb, &sfb)) ||
        dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) || dgp_tensor_from(masked, fn, "masked_m", 0, &tm) ||
        dgp_gemm_opts(fn, recipe, recipe_a, recipe_b, dims, disable, &opts))
        return NULL;
    dg_status st;
    if (packed) {
        const dg_packed_b *pb;
        if (dgp_packed_begin(b, fn, "b", 1, 1, &opts, &pb))
            return NULL;
        DGP_NOGIL(st, dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&ta.t, &sfa.t, pb, &td.t, &tm.t, expected_m, &opts));
        dgp_packed_end(b);
    } else {
        DGP_NOGIL(st, dg_m_grouped_fp8_fp4_gemm_nt_masked(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, &tm.t, expected_m,
                                                          &opts));
    }
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

/* k-grouped: ks_cpu is a list of ints (or None); fp8 recipe defaults to (1, 1, 128), FP4's
 * (nt == 2: k_grouped_fp4_gemm_nt_contiguous) to (1, 1, 32). */
static PyObject *k_grouped(PyObject *args, PyObject *kw, const char *fn, int fp8, int nt) {
    static char *kw_fp8[] = {"a", "b", "d", "ks_cpu", "grouped_layout", "c", "recipe", "compiled_dims",
                             "use_psum_layout", NULL};
    static char *kw_bf16[] = {"a", "b", "d", "ks_cpu", "grouped_layout", "c", "compiled_dims", "use_psum_layout",
                              NULL};
    PyObject *a, *b, *d, *ks_obj, *layout, *c = Py_None, *recipe = Py_None;
    const char *dims = "mn";
    int use_psum = 0, ok;
    char fmt[80];
    if (fp8) {
        snprintf(fmt, sizeof fmt, "OOOOO|OOsp:%s", fn);
        ok = PyArg_ParseTupleAndKeywords(args, kw, fmt, kw_fp8, &a, &b, &d, &ks_obj, &layout, &c, &recipe, &dims,
                                         &use_psum);
    } else {
        snprintf(fmt, sizeof fmt, "OOOOO|Osp:%s", fn);
        ok = PyArg_ParseTupleAndKeywords(args, kw, fmt, kw_bf16, &a, &b, &d, &ks_obj, &layout, &c, &dims, &use_psum);
    }
    if (!ok)
        return NULL;
    dgp_tensor ta, sfa = {0}, tb, sfb = {0}, td, tl, tc;
    dg_gemm_options opts = dg_gemm_options_default();
    int *ks = NULL, num_ks = 0, given = 0;
    int rc = fp8 ? (dgp_pair_from(a, fn, "a", 0, &ta, &sfa) || dgp_pair_from(b, fn, "b", 0, &tb, &sfb))
                 : (dgp_tensor_from(a, fn, "a", 0, &ta) || dgp_tensor_from(b, fn, "b", 0, &tb));
    if (rc || dgp_tensor_from(d, fn, "d", DGP_WRITABLE, &td) ||
        dgp_tensor_from(layout, fn, "grouped_layout", 0, &tl) || dgp_tensor_from(c, fn, "c", DGP_OPTIONAL, &tc) ||
        dgp_int_tuple(recipe, fn, "recipe", 3, 1, opts.recipe, &given) ||
        dgp_int_list(ks_obj, fn, "ks_cpu", &ks, &num_ks))
        return NULL;
    if (fp8 && !given) {
        opts.recipe[0] = 1, opts.recipe[1] = 1, opts.recipe[2] = nt == 2 ? 32 : 128; /* DeepGEMM's */
    }
    opts.compiled_dims = dims;
    opts.use_psum_layout = use_psum;
    dg_status st;
    if (!fp8)
        DGP_NOGIL(st, dg_k_grouped_bf16_gemm_tn_contiguous(&ta.t, &tb.t, &td.t, ks, num_ks, &tl.t, dgp_ptr(&tc), &opts));
    else if (nt == 2)
        DGP_NOGIL(st, dg_k_grouped_fp4_gemm_nt_contiguous(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, ks, num_ks, &tl.t,
                                                          dgp_ptr(&tc), &opts));
    else if (nt)
        DGP_NOGIL(st, dg_k_grouped_fp8_gemm_nt_contiguous(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, ks, num_ks, &tl.t,
                                                          dgp_ptr(&tc), &opts));
    else
        DGP_NOGIL(st, dg_k_grouped_fp8_gemm_tn_contiguous(&ta.t, &sfa.t, &tb.t, &sfb.t, &td.t, ks, num_ks, &tl.t,
                                                          dgp_ptr(&tc), &opts));
    PyMem_Free(ks);
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_k_grouped_fp8_gemm_tn_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return k_grouped(args, kw, "k_grouped_fp8_gemm_tn_contiguous", 1, 0);
}
static PyObject *py_k_grouped_fp8_gemm_nt_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return k_grouped(args, kw, "k_grouped_fp8_gemm_nt_contiguous", 1, 1);
}
static PyObject *py_k_grouped_fp4_gemm_nt_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return k_grouped(args, kw, "k_grouped_fp4_gemm_nt_contiguous", 1, 2);
}
static PyObject *py_k_grouped_bf16_gemm_tn_contiguous(PyObject *s, PyObject *args, PyObject *kw) {
    return k_grouped(args, kw, "k_grouped_bf16_gemm_tn_contiguous", 0, 0);
}

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
PyMethodDef dgp_grouped_methods[] = {
    M(m_grouped_bf16_gemm_nt_contiguous,
      "m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims='nk', use_psum_layout=False, "
      "ensure_zero_padding=True, expected_m_for_psum_layout=None)"),
    M(m_grouped_bf16_gemm_nn_contiguous,
      "m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, compiled_dims='nk', use_psum_layout=False, "
      "ensure_zero_padding=True)"),
    M(m_grouped_fp8_fp4_gemm_nt_contiguous,
      "m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None, "
      "compiled_dims='nk', disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True, "
      "expected_m_for_psum_layout=None)"),
    M(m_grouped_fp8_fp4_gemm_nn_contiguous,
      "m_grouped_fp8_fp4_gemm_nn_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None, "
      "compiled_dims='nk', disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True)"),
    M(m_grouped_bf16_gemm_nt_masked,
      "m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims='nk')"),
    M(m_grouped_fp8_fp4_gemm_nt_masked,
      "m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, "
      "recipe_b=None, compiled_dims='nk', disable_ue8m0_cast=False)"),
    M(k_grouped_fp8_gemm_tn_contiguous,
      "k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), "
      "compiled_dims='mn', use_psum_layout=False)"),
    M(k_grouped_fp4_gemm_nt_contiguous,
      "k_grouped_fp4_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32), "
      "compiled_dims='mn', use_psum_layout=False): d[g] = c[g] + a_g @ b_g.T, a [M, sum_k/2] / b [N, sum_k/2] "
      "packed FP4 (K-major), scales [rows, M] / [rows, N]"),
    M(k_grouped_fp8_gemm_nt_contiguous,
      "k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), "
      "compiled_dims='mn', use_psum_layout=False)"),
    M(k_grouped_bf16_gemm_tn_contiguous,
      "k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims='mn', "
      "use_psum_layout=False)"),
    {NULL, NULL, 0, NULL},
};

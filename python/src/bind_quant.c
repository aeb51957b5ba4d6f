/*
 * bind_quant.c - the quantization helpers of deep_gemm.utils (per_*_cast_to_fp8/fp4,
 * cast_back_from_fp4, cast_back_from_fp8, transpose_packed_fp4, ceil_to_ue8m0, pack/unpack
 * UE8M0) and calc_diff, computed by the library. Outputs are new tensors (torch or NumPy, like the input).
 */
#include "dgpy.h"

/* Query both outputs, allocate them like x, fill. Returns (out, sf). */
#define DGP_QUERY2(like, o1, o2, call)                                             \
    do {                                                                           \
        dg_status st_ = (call);                                                    \
        if (st_ != DG_OK)                                                          \
            return dgp_raise(st_);                                                 \
        PyObject *r1_ = dgp_alloc((like), &(o1));                                  \
        PyObject *r2_ = r1_ ? dgp_alloc((like), &(o2)) : NULL;                     \
        if (!r2_) {                                                                \
            Py_XDECREF(r1_);                                                       \
            return NULL;                                                           \
        }                                                                          \
        DGP_NOGIL(st_, call);                                                      \
        if (st_ != DG_OK) {                                                        \
            Py_DECREF(r1_);                                                        \
            Py_DECREF(r2_);                                                        \
            return dgp_raise(st_);                                                 \
        }                                                                          \
        return Py_BuildValue("(NN)", r1_, r2_);                                    \
    } while (0)

static PyObject *token_cast(PyObject *args, PyObject *kw, const char *fn, int fp4) {
    static char *kwl[] = {"x", "use_ue8m0", "gran_k", "use_packed_ue8m0", NULL};
    PyObject *x, *gran_obj = NULL;
    int ue8m0, gran_k = 128, packed = 0;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "Op|Op:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &x, &ue8m0, &gran_obj, &packed) ||
        (gran_obj && dgp_int(gran_obj, fn, "gran_k", &gran_k)))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(x, fn, "x", 0, &t))
        return NULL;
    dg_tensor out = {0}, sf = {0};
    if (fp4)
        DGP_QUERY2(x, out, sf, dg_per_token_cast_to_fp4(&t.t, ue8m0, gran_k, packed, &out, &sf));
    DGP_QUERY2(x, out, sf, dg_per_token_cast_to_fp8(&t.t, ue8m0, gran_k, packed, &out, &sf));
}
static PyObject *py_per_token_cast_to_fp8(PyObject *s, PyObject *args, PyObject *kw) {
    return token_cast(args, kw, "per_token_cast_to_fp8", 0);
}
static PyObject *py_per_token_cast_to_fp4(PyObject *s, PyObject *args, PyObject *kw) {
    return token_cast(args, kw, "per_token_cast_to_fp4", 1);
}

static PyObject *block_cast(PyObject *args, PyObject *kw, const char *fn, int channel) {
    static char *kwl[] = {"x", "use_ue8m0", "gran_k", NULL};
    PyObject *x, *gran_obj = NULL;
    int ue8m0, gran_k = 128;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "Op|O:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &x, &ue8m0, &gran_obj) ||
        (gran_obj && dgp_int(gran_obj, fn, "gran_k", &gran_k)))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(x, fn, "x", 0, &t))
        return NULL;
    dg_tensor out = {0}, sf = {0};
    if (channel)
        DGP_QUERY2(x, out, sf, dg_per_channel_cast_to_fp8(&t.t, ue8m0, gran_k, &out, &sf));
    DGP_QUERY2(x, out, sf, dg_per_block_cast_to_fp8(&t.t, ue8m0, gran_k, &out, &sf));
}
static PyObject *py_per_block_cast_to_fp8(PyObject *s, PyObject *args, PyObject *kw) {
    return block_cast(args, kw, "per_block_cast_to_fp8", 0);
}
static PyObject *py_per_channel_cast_to_fp8(PyObject *s, PyObject *args, PyObject *kw) {
    return block_cast(args, kw, "per_channel_cast_to_fp8", 1);
}

static PyObject *py_per_custom_dims_cast_to_fp8(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "per_custom_dims_cast_to_fp8";
    static char *kwl[] = {"x", "dims", "use_ue8m0", NULL};
    PyObject *x, *dims_obj;
    int ue8m0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOp:per_custom_dims_cast_to_fp8", kwl, &x, &dims_obj, &ue8m0))
        return NULL;
    dgp_tensor t;
    int *dims = NULL, nd = 0;
    if (dgp_tensor_from(x, fn, "x", 0, &t) || dgp_int_list(dims_obj, fn, "dims", &dims, &nd))
        return NULL;
    dg_tensor out = {0}, sf = {0};
    PyObject *r1 = NULL, *r2 = NULL, *res = NULL;
    dg_status st = dg_per_custom_dims_cast_to_fp8(&t.t, dims, nd, ue8m0, &out, &sf);
    if (st != DG_OK) {
        dgp_raise(st);
    } else if ((r1 = dgp_alloc(x, &out)) && (r2 = dgp_alloc(x, &sf))) {
        DGP_NOGIL(st, dg_per_custom_dims_cast_to_fp8(&t.t, dims, nd, ue8m0, &out, &sf));
        if (st != DG_OK)
            dgp_raise(st);
        else
            res = Py_BuildValue("(OO)", r1, r2);
    }
    Py_XDECREF(r1);
    Py_XDECREF(r2);
    PyMem_Free(dims);
    return res;
}

/* Allocate `out` shaped as given, run `call` without the GIL, return the new array. */
#define DGP_ALLOC_RUN(like, dtype, nd, shape, out, call)                    \
    do {                                                                    \
        PyObject *r_ = dgp_alloc_shape((like), (dtype), (nd), (shape), &(out)); \
        if (!r_)                                                            \
            return NULL;                                                    \
        dg_status st_;                                                      \
        DGP_NOGIL(st_, call);                                               \
        if (st_ != DG_OK) {                                                 \
            Py_DECREF(r_);                                                  \
            return dgp_raise(st_);                                          \
        }                                                                   \
        return r_;                                                          \
    } while (0)

static PyObject *py_cast_back_from_fp4(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "cast_back_from_fp4";
    static char *kwl[] = {"packed", "sf", "gran_k", "use_packed_ue8m0", NULL};
    PyObject *p, *sf, *gran_obj = NULL;
    int gran_k = 128, packed_sf = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Op:cast_back_from_fp4", kwl, &p, &sf, &gran_obj, &packed_sf) ||
        (gran_obj && dgp_int(gran_obj, fn, "gran_k", &gran_k)))
        return NULL;
    dgp_tensor tp, ts;
    if (dgp_tensor_from(p, fn, "packed", 0, &tp) || dgp_tensor_from(sf, fn, "sf", 0, &ts))
        return NULL;
    int64_t shape[2] = {0, 0};
    if (tp.t.ndim == 2)
        shape[0] = tp.t.shape[0], shape[1] = 2 * tp.t.shape[1];
    dg_tensor out;
    DGP_ALLOC_RUN(p, DG_FLOAT32, 2, shape, out, dg_cast_back_from_fp4(&tp.t, &ts.t, gran_k, packed_sf, &out));
}

static PyObject *py_cast_back_from_fp8(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "cast_back_from_fp8";
    static char *kwl[] = {"x", "sf", "gran_k", "use_packed_ue8m0", NULL};
    PyObject *x, *sf, *gran_obj = NULL;
    int gran_k = 128, packed_sf = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Op:cast_back_from_fp8", kwl, &x, &sf, &gran_obj, &packed_sf) ||
        (gran_obj && dgp_int(gran_obj, fn, "gran_k", &gran_k)))
        return NULL;
    dgp_tensor tx, ts;
    if (dgp_tensor_from(x, fn, "x", 0, &tx) || dgp_tensor_from(sf, fn, "sf", 0, &ts))
        return NULL;
    int64_t shape[2] = {0, 0}; /* a wrong rank is refused by the call */
    if (tx.t.ndim == 2)
        shape[0] = tx.t.shape[0], shape[1] = tx.t.shape[1];
    dg_tensor out;
    DGP_ALLOC_RUN(x, DG_FLOAT32, 2, shape, out, dg_cast_back_from_fp8(&tx.t, &ts.t, gran_k, packed_sf, &out));
}

static PyObject *py_transpose_packed_fp4(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"a", NULL};
    PyObject *a;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:transpose_packed_fp4", kwl, &a))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(a, "transpose_packed_fp4", "a", 0, &t))
        return NULL;
    int64_t shape[2] = {0, 0};
    if (t.t.ndim == 2)
        shape[0] = 2 * t.t.shape[1], shape[1] = t.t.shape[0] / 2;
    dg_tensor out;
    DGP_ALLOC_RUN(a, t.t.dtype, 2, shape, out, dg_transpose_packed_fp4(&t.t, &out));
}

static PyObject *py_ceil_to_ue8m0(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"x", NULL};
    PyObject *x;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:ceil_to_ue8m0", kwl, &x))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(x, "ceil_to_ue8m0", "x", 0, &t))
        return NULL;
    dg_tensor out;
    DGP_ALLOC_RUN(x, DG_FLOAT32, t.t.ndim, t.t.shape, out, dg_ceil_to_ue8m0_tensor(&t.t, &out));
}

/* pack (factor 4 -> 1, INT32) or unpack (1 -> 4, FLOAT32) along the last dimension. */
static PyObject *ue8m0_pack(PyObject *args, PyObject *kw, const char *fn, const char *arg, int unpack) {
    static char *kw_pack[] = {"x", NULL}, *kw_unpack[] = {"packed_sf", NULL};
    PyObject *x;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "O:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, unpack ? kw_unpack : kw_pack, &x))
        return NULL;
    dgp_tensor t;
    if (dgp_tensor_from(x, fn, arg, 0, &t))
        return NULL;
    int64_t shape[DG_MAX_DIMS];
    int nd = t.t.ndim > 0 ? t.t.ndim : 1;
    for (int i = 0; i < nd; ++i)
        shape[i] = i < t.t.ndim ? t.t.shape[i] : 0;
    shape[nd - 1] = unpack ? shape[nd - 1] * 4 : shape[nd - 1] / 4;
    dg_tensor out;
    if (unpack)
        DGP_ALLOC_RUN(x, DG_FLOAT32, nd, shape, out, dg_unpack_ue8m0_from_int(&t.t, &out));
    DGP_ALLOC_RUN(x, DG_INT32, nd, shape, out, dg_pack_ue8m0_to_int(&t.t, &out));
}
static PyObject *py_pack_ue8m0_to_int(PyObject *s, PyObject *args, PyObject *kw) {
    return ue8m0_pack(args, kw, "pack_ue8m0_to_int", "x", 0);
}
static PyObject *py_unpack_ue8m0_from_int(PyObject *s, PyObject *args, PyObject *kw) {
    return ue8m0_pack(args, kw, "unpack_ue8m0_from_int", "packed_sf", 1);
}

static PyObject *py_calc_diff(PyObject *s, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"x", "y", NULL};
    PyObject *x, *y;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:calc_diff", kwl, &x, &y))
        return NULL;
    dgp_tensor tx, ty;
    if (dgp_tensor_from(x, "calc_diff", "x", 0, &tx) || dgp_tensor_from(y, "calc_diff", "y", 0, &ty))
        return NULL;
    double out = 0;
    dg_status st;
    DGP_NOGIL(st, dg_calc_diff(&tx.t, &ty.t, &out));
    return st == DG_OK ? PyFloat_FromDouble(out) : dgp_raise(st);
}

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
PyMethodDef dgp_quant_methods[] = {
    M(per_token_cast_to_fp8, "per_token_cast_to_fp8(x, use_ue8m0, gran_k=128, use_packed_ue8m0=False) -> (x_fp8, sf)"),
    M(per_block_cast_to_fp8, "per_block_cast_to_fp8(x, use_ue8m0, gran_k=128) -> (x_fp8, sf)"),
    M(per_channel_cast_to_fp8, "per_channel_cast_to_fp8(x, use_ue8m0, gran_k=128) -> (x_fp8, sf)"),
    M(per_custom_dims_cast_to_fp8, "per_custom_dims_cast_to_fp8(x, dims, use_ue8m0) -> (x_fp8, sf)"),
    M(per_token_cast_to_fp4, "per_token_cast_to_fp4(x, use_ue8m0, gran_k=128, use_packed_ue8m0=False) -> "
                             "(packed int8, sf)"),
    M(cast_back_from_fp4, "cast_back_from_fp4(packed, sf, gran_k=128, use_packed_ue8m0=False) -> float32"),
    M(cast_back_from_fp8, "cast_back_from_fp8(x, sf, gran_k=128, use_packed_ue8m0=False) -> float32"),
    M(transpose_packed_fp4, "transpose_packed_fp4(a) -> packed int8 [N, M/2]"),
    M(ceil_to_ue8m0, "ceil_to_ue8m0(x) -> float32 powers of two"),
    M(pack_ue8m0_to_int, "pack_ue8m0_to_int(x) -> int32 [..., S/4]"),
    M(unpack_ue8m0_from_int, "unpack_ue8m0_from_int(packed_sf) -> float32 [..., 4*S]"),
    M(calc_diff, "calc_diff(x, y) -> 1 - 2 sum(xy) / sum(x^2 + y^2), computed in double"),
    {NULL, NULL, 0, NULL},
};

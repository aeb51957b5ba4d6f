/*
 * convert.c - Python objects to dg_tensor descriptors (zero copy), status to exceptions,
 * output allocation.
 *
 * Torch is never linked or imported here: a torch tensor is recognised by its attributes
 * (data_ptr, stride, device) and read through them, so the extension builds without PyTorch.
 * NumPy arrays (with ml_dtypes' bfloat16 / float8_e4m3fn) are read through __array_interface__.
 */
#include "dgpy.h"

#include <string.h>

/* Non-NULL memory for empty tensors: a NULL data pointer would mean "query form" to the library. */
static _Alignas(64) unsigned char dgp_empty_storage[64];

static const struct {
    const char *name;
    dg_dtype dtype;
} dgp_dtype_names[] = {
    {"float32", DG_FLOAT32},     {"float", DG_FLOAT32},        {"bfloat16", DG_BFLOAT16},
    {"float8_e4m3fn", DG_FLOAT8_E4M3}, {"int8", DG_FP4_E2M1X2}, {"int32", DG_INT32},
    {"int", DG_INT32},           {"int64", DG_INT64},          {"long", DG_INT64},
    {"uint8", DG_UINT8},         {"float8_e8m0fnu", DG_UE8M0}, {"float16", DG_FLOAT16},
    {"half", DG_FLOAT16},
};

/* The name torch and NumPy use for the dtype we allocate (int8 for packed FP4, as DeepGEMM). */
static const char *dgp_alloc_dtype_name(dg_dtype d) {
    switch (d) {
    case DG_FLOAT32: return "float32";
    case DG_BFLOAT16: return "bfloat16";
    case DG_FLOAT8_E4M3: return "float8_e4m3fn";
    case DG_FP4_E2M1X2: case DG_INT8: return "int8";
    case DG_INT32: return "int32";
    case DG_INT64: return "int64";
    case DG_UINT8: return "uint8";
    case DG_UE8M0: return "float8_e8m0fnu";
    case DG_FLOAT16: return "float16";
    default: return "?";
    }
}

/* "torch.float32" -> "float32"; NULL (with no exception) when not a known name. */
static int dgp_dtype_by_name(const char *name, dg_dtype *out) {
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (size_t i = 0; i < sizeof(dgp_dtype_names) / sizeof(dgp_dtype_names[0]); ++i)
        if (strcmp(name, dgp_dtype_names[i].name) == 0) {
            *out = dgp_dtype_names[i].dtype;
            return 0;
        }
    return -1;
}

PyObject *dgp_raise(dg_status st) {
    const char *msg = dg_last_error();
    if (!msg || !*msg)
        msg = dg_status_string(st);
    PyObject *exc = PyExc_RuntimeError;
    switch (st) {
    case DG_ERR_DTYPE: exc = PyExc_TypeError; break;
    case DG_ERR_NULL_POINTER:
    case DG_ERR_SHAPE:
    case DG_ERR_LAYOUT:
    case DG_ERR_VALUE:
    case DG_ERR_OVERFLOW: exc = PyExc_ValueError; break;
    case DG_ERR_UNSUPPORTED: exc = PyExc_NotImplementedError; break;
    default: break;
    }
    PyErr_SetString(exc, msg);
    return NULL;
}

/* A sequence of Python ints into int64s; -1 with an exception otherwise. */
static int dgp_int64_seq(PyObject *seq, const char *fn, const char *arg, const char *what, int64_t *vals,
                         int *n) {
    PyObject *fast = PySequence_Fast(seq, "not a sequence");
    if (!fast) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' has a %s that is not a sequence", fn, arg, what);
        return -1;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > DG_MAX_DIMS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' has %zd dimensions, at most %d are supported", fn, arg,
                     len, DG_MAX_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; ++i) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            PyErr_Format(PyExc_TypeError, "%s: argument '%s' has a %s that is not a tuple of ints", fn, arg, what);
            return -1;
        }
        vals[i] = v;
    }
    *n = (int)len;
    Py_DECREF(fast);
    return 0;
}

static int dgp_set_dtype(PyObject *dtype_obj, const char *fn, const char *arg, dg_dtype *out) {
    PyObject *s = PyObject_HasAttrString(dtype_obj, "name") ? PyObject_GetAttrString(dtype_obj, "name")
                                                            : PyObject_Str(dtype_obj);
    if (!s)
        return -1;
    const char *name = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
    int rc = name ? dgp_dtype_by_name(name, out) : -1;
    if (rc != 0) {
        PyObject *r = PyObject_Str(dtype_obj);
        PyErr_Format(PyExc_TypeError,
                     "%s: argument '%s' has dtype %s; expected one of float32, bfloat16, float8_e4m3fn, "
                     "int8 (packed FP4), int32 (packed UE8M0), int64, uint8",
                     fn, arg, r ? PyUnicode_AsUTF8(r) : "?");
        Py_XDECREF(r);
    }
    Py_DECREF(s);
    return rc;
}

/* A torch tensor (or anything shaped like one): attributes only. */
static int dgp_from_torch(PyObject *obj, const char *fn, const char *arg, dgp_tensor *out) {
    PyObject *dev = PyObject_GetAttrString(obj, "device");
    if (!dev)
        return -1;
    PyObject *type = PyObject_GetAttrString(dev, "type");
    int is_cpu = type && PyUnicode_Check(type) && strcmp(PyUnicode_AsUTF8(type), "cpu") == 0;
    Py_XDECREF(type);
    if (!is_cpu) {
        PyErr_Clear();
        PyObject *s = PyObject_Str(dev);
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' is on device '%s'; deep_gemm_cpu takes CPU tensors", fn,
                     arg, s ? PyUnicode_AsUTF8(s) : "?");
        Py_XDECREF(s);
        Py_DECREF(dev);
        return -1;
    }
    Py_DECREF(dev);

    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype)
        return -1;
    int rc = dgp_set_dtype(dtype, fn, arg, &out->t.dtype);
    Py_DECREF(dtype);
    if (rc)
        return -1;

    PyObject *shape = PyObject_GetAttrString(obj, "shape");
    PyObject *stride = shape ? PyObject_CallMethod(obj, "stride", NULL) : NULL;
    int nd = 0, nd2 = 0;
    rc = (shape && stride) ? 0 : -1;
    if (!rc)
        rc = dgp_int64_seq(shape, fn, arg, "shape", out->t.shape, &nd);
    if (!rc)
        rc = dgp_int64_seq(stride, fn, arg, "stride()", out->t.strides, &nd2);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    if (rc)
        return -1;
    if (nd != nd2) {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' has %d sizes but %d strides", fn, arg, nd, nd2);
        return -1;
    }
    out->t.ndim = nd;

    PyObject *ptr = PyObject_CallMethod(obj, "data_ptr", NULL);
    if (!ptr)
        return -1;
    out->t.data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* A NumPy (or __array_interface__) array; ml_dtypes types are recognised by dtype.name. */
static int dgp_from_array(PyObject *obj, PyObject *ai, const char *fn, const char *arg, int flags,
                          dgp_tensor *out) {
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype)
        return -1;
    int rc = dgp_set_dtype(dtype, fn, arg, &out->t.dtype);
    Py_DECREF(dtype);
    if (rc)
        return -1;
    if (!PyDict_Check(ai)) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' has an __array_interface__ that is not a dict", fn, arg);
        return -1;
    }
    PyObject *typestr = PyDict_GetItemString(ai, "typestr");
    if (typestr && PyUnicode_Check(typestr) && PyUnicode_AsUTF8(typestr)[0] == '>') {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' is big-endian; native byte order is required", fn, arg);
        return -1;
    }
    PyObject *shape = PyDict_GetItemString(ai, "shape");
    PyObject *strides = PyDict_GetItemString(ai, "strides");
    PyObject *data = PyDict_GetItemString(ai, "data");
    if (!shape || !data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' has an __array_interface__ without shape or data", fn,
                     arg);
        return -1;
    }
    int nd = 0;
    if (dgp_int64_seq(shape, fn, arg, "shape", out->t.shape, &nd))
        return -1;
    out->t.ndim = nd;
    int64_t esize = (int64_t)dg_dtype_size(out->t.dtype);
    if (strides && strides != Py_None) {
        int64_t bytes[DG_MAX_DIMS];
        int nd2 = 0;
        if (dgp_int64_seq(strides, fn, arg, "strides", bytes, &nd2))
            return -1;
        for (int i = 0; i < nd; ++i) {
            if (i >= nd2 || bytes[i] % esize != 0) {
                PyErr_Format(PyExc_ValueError, "%s: argument '%s' has a byte stride not a multiple of its element size",
                             fn, arg);
                return -1;
            }
            out->t.strides[i] = bytes[i] / esize;
        }
    } else {
        int64_t s = 1;
        for (int i = nd - 1; i >= 0; --i) {
            out->t.strides[i] = s;
            s *= out->t.shape[i] > 0 ? out->t.shape[i] : 1;
        }
    }
    if ((flags & DGP_WRITABLE) && PyObject_IsTrue(PyTuple_GET_ITEM(data, 1))) {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' is read-only but is written", fn, arg);
        return -1;
    }
    out->t.data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    return PyErr_Occurred() ? -1 : 0;
}

/* Reached only where a call takes no packed weights (the `_nt` GEMMs check for them first). */
static int packed_refused(const char *fn, const char *arg) {
    PyErr_Format(PyExc_TypeError,
                 "%s: argument '%s' is a PackedB, which this function does not take; only the `_nt` GEMMs take "
                 "packed weights, as 'b' (bf16_gemm_nt, fp8_fp4_gemm_nt, m_grouped_*_gemm_nt_masked, "
                 "m_grouped_*_gemm_nt_contiguous)",
                 fn, arg);
    return -1;
}

int dgp_tensor_from(PyObject *obj, const char *fn, const char *arg, int flags, dgp_tensor *out) {
    memset(out, 0, sizeof(*out));
    if (dgp_is_packed(obj))
        return packed_refused(fn, arg);
    if (obj == NULL || obj == Py_None) {
        if (flags & DGP_OPTIONAL)
            return 0;
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' is required (got None)", fn, arg);
        return -1;
    }
    int rc;
    PyObject *ai = NULL;
    if (PyObject_HasAttrString(obj, "data_ptr") && PyObject_HasAttrString(obj, "device")) {
        rc = dgp_from_torch(obj, fn, arg, out);
    } else if ((ai = PyObject_GetAttrString(obj, "__array_interface__")) != NULL) {
        rc = dgp_from_array(obj, ai, fn, arg, flags, out);
        Py_DECREF(ai);
    } else {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a torch.Tensor or numpy.ndarray, got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (rc)
        return -1;
    if (out->t.data == NULL || dg_tensor_numel(&out->t) == 0)
        out->t.data = dgp_empty_storage;
    out->present = 1;
    return 0;
}

int dgp_pair_from(PyObject *obj, const char *fn, const char *arg, int sf_optional, dgp_tensor *data,
                  dgp_tensor *sf) {
    if (dgp_is_packed(obj))
        return packed_refused(fn, arg);
    if (!(PyTuple_Check(obj) || PyList_Check(obj)) || PySequence_Size(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a (tensor, scale factors) tuple, got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    char name[96];
    snprintf(name, sizeof name, "%s[0]", arg);
    PyObject *d = PySequence_GetItem(obj, 0), *s = PySequence_GetItem(obj, 1);
    int rc = dgp_tensor_from(d, fn, name, 0, data);
    if (!rc) {
        snprintf(name, sizeof name, "%s[1]", arg);
        rc = dgp_tensor_from(s, fn, name, sf_optional ? DGP_OPTIONAL : 0, sf);
    }
    Py_XDECREF(d);
    Py_XDECREF(s);
    return rc;
}

/* obj as a Python int (a new reference), through __index__ as CPython's own int parsing does
 * (bools, NumPy integers, one-element integer tensors); anything else, or an __index__ that
 * refuses (a float tensor), is a TypeError naming fn and arg. */
static PyObject *dgp_index(PyObject *obj, const char *fn, const char *arg) {
    if (PyLong_Check(obj) || PyIndex_Check(obj)) {
        PyObject *v = PyNumber_Index(obj);
        if (v || !PyErr_ExceptionMatches(PyExc_TypeError))
            return v;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be an int, got %s", fn, arg, Py_TYPE(obj)->tp_name);
    return NULL;
}

/* The ValueError for an int v out of range; v's digits when Python can print them. */
static int dgp_int_overflow(PyObject *v, const char *fn, const char *arg, int bits) {
    PyObject *text = PyObject_Str(v);
    if (text) {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' = %U does not fit in a %d-bit int", fn, arg, text, bits);
        Py_DECREF(text);
    } else { /* past sys.get_int_max_str_digits() */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' (an int too long to print) does not fit in a %d-bit int",
                     fn, arg, bits);
    }
    return -1;
}

/* The one conversion of integer arguments: obj -> int64 in [lo, hi], bits naming the range. */
static int dgp_int_range(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t hi, int bits,
                         int64_t *val) {
    PyObject *v = dgp_index(obj, fn, arg);
    if (!v)
        return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return -1;
    }
    int rc = 0;
    if (overflow || x < lo || x > hi)
        rc = dgp_int_overflow(v, fn, arg, bits);
    else
        *val = (int64_t)x;
    Py_DECREF(v);
    return rc;
}

int dgp_int(PyObject *obj, const char *fn, const char *arg, int *val) {
    int64_t v;
    if (dgp_int_range(obj, fn, arg, INT32_MIN, INT32_MAX, 32, &v))
        return -1;
    *val = (int)v;
    return 0;
}

int dgp_int64(PyObject *obj, const char *fn, const char *arg, int64_t *val) {
    return dgp_int_range(obj, fn, arg, INT64_MIN, INT64_MAX, 64, val);
}

int dgp_opt_int(PyObject *obj, const char *fn, const char *arg, int *val, int *given) {
    *given = 0;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (dgp_int(obj, fn, arg, val))
        return -1;
    *given = 1;
    return 0;
}

int dgp_int_tuple(PyObject *obj, const char *fn, const char *arg, int n, int allow_none, int *vals, int *given) {
    if (given)
        *given = 0;
    if (obj == NULL || obj == Py_None) {
        if (allow_none)
            return 0;
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' is required (got None)", fn, arg);
        return -1;
    }
    if (!(PyTuple_Check(obj) || PyList_Check(obj)) || PySequence_Size(obj) != n) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a tuple of %d ints", fn, arg, n);
        return -1;
    }
    for (int i = 0; i < n; ++i) {
        PyObject *it = PySequence_GetItem(obj, i);
        int rc = it ? dgp_int(it, fn, arg, &vals[i]) : -1;
        Py_XDECREF(it);
        if (rc)
            return -1;
    }
    if (given)
        *given = 1;
    return 0;
}

int dgp_int_list(PyObject *obj, const char *fn, const char *arg, int **vals, int *count) {
    *vals = NULL;
    *count = 0;
    if (obj == NULL || obj == Py_None)
        return 0;
    PyObject *list = NULL;
    if (PyObject_HasAttrString(obj, "tolist"))
        list = PyObject_CallMethod(obj, "tolist", NULL);
    else {
        Py_INCREF(obj);
        list = obj;
    }
    if (!list)
        return -1;
    PyObject *fast = PySequence_Fast(list, "");
    Py_DECREF(list);
    if (!fast) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a list of ints", fn, arg);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int *v = PyMem_Malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; ++i)
        if (dgp_int(PySequence_Fast_GET_ITEM(fast, i), fn, arg, &v[i])) {
            PyMem_Free(v);
            Py_DECREF(fast);
            return -1;
        }
    Py_DECREF(fast);
    *vals = v;
    *count = (int)n;
    return 0;
}

int dgp_dtype_from(PyObject *obj, const char *fn, const char *arg, dg_dtype *out) {
    if (PyUnicode_Check(obj)) {
        if (dgp_dtype_by_name(PyUnicode_AsUTF8(obj), out) == 0)
            return 0;
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' names an unknown dtype '%U'", fn, arg, obj);
        return -1;
    }
    return dgp_set_dtype(obj, fn, arg, out);
}

/* ---- allocation -------------------------------------------------------------------------- */

PyObject *dgp_alloc(PyObject *like, dg_tensor *t) {
    static PyObject *allocate = NULL;
    if (!allocate) {
        PyObject *mod = PyImport_ImportModule("deep_gemm_cpu._alloc");
        if (!mod)
            return NULL;
        allocate = PyObject_GetAttrString(mod, "allocate");
        Py_DECREF(mod);
        if (!allocate)
            return NULL;
    }
    PyObject *shape = PyTuple_New(t->ndim), *strides = PyTuple_New(t->ndim);
    if (!shape || !strides) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return NULL;
    }
    for (int i = 0; i < t->ndim; ++i) {
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t->shape[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(t->strides[i]));
    }
    PyObject *arr = PyObject_CallFunction(allocate, "OsOO", like ? like : Py_None, dgp_alloc_dtype_name(t->dtype),
                                          shape, strides);
    Py_DECREF(shape);
    Py_DECREF(strides);
    if (!arr)
        return NULL;
    dgp_tensor got;
    if (dgp_tensor_from(arr, "allocate", "out", DGP_WRITABLE, &got)) {
        Py_DECREF(arr);
        return NULL;
    }
    t->data = got.t.data;
    return arr;
}

PyObject *dgp_alloc_shape(PyObject *like, dg_dtype dtype, int ndim, const int64_t *shape, dg_tensor *t) {
    *t = dg_tensor_make(NULL, dtype, ndim, shape);
    return dgp_alloc(like, t);
}

/*
 * bind_packed.c - pre-packed weights: deep_gemm_cpu.pack_b(b, ...) -> PackedB, an object owning
 * one dg_packed_b (dense [N, K] or m-grouped [G, N, K]), and the helpers with which the `_nt`
 * GEMM bindings take such an object in place of b. DeepGEMM has no such API; the names follow
 * its argument `b` (the weights) and its recipe keywords.
 *
 * Lifetime: free() (or leaving a `with` block) makes the object unusable at once, but the C
 * memory is released only when no GEMM is running on it: those calls run without the GIL and
 * must not have the panels freed under them by another thread.
 */
#include "dgpy.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    dg_packed_b *handle; /* NULL once the memory is released */
    int freed;           /* free() was called: no new call may use it */
    int in_flight;       /* GEMM calls running on handle (counted under the GIL) */
    dg_dtype dtype;      /* B's dtype: BFLOAT16, FLOAT8_E4M3 or FP4_E2M1X2 */
    dg_dtype sf_dtype;   /* FLOAT32 or INT32 (packed UE8M0); unused for BF16 */
    int gran_b[2];       /* B's (gran_n, gran_k) fixed at packing; 0 for BF16 */
    int64_t groups;      /* 0 for a dense B */
    int64_t n, k;        /* logical K: two FP4 values per byte */
    dg_isa isa;          /* the level packed for: a call under another level is refused by the library */
} dgp_packed;

static PyTypeObject dgp_packed_type;

int dgp_is_packed(PyObject *obj) { return obj && PyObject_TypeCheck(obj, &dgp_packed_type); }

static void release_memory(dgp_packed *p) {
    dg_packed_b_free(p->handle);
    p->handle = NULL;
}

static const char *kind_name(dg_dtype dt) {
    switch (dt) {
    case DG_BFLOAT16: return "bf16";
    case DG_FLOAT8_E4M3: return "fp8";
    default: return "fp4";
    }
}

/* B's (gran_n, gran_k) from the recipe arguments, as the library resolves them for scales of
 * sf_dtype (DeepGEMM's get_default_recipe when none is given: float32 scales are the legacy
 * 128x128 blocks, packed UE8M0 ones per row). Returns 0 when the arguments are inconsistent
 * (recipe with the pair, or half a pair): the library then names the problem itself. */
static int resolve_gran_b(const dg_gemm_options *o, dg_dtype sf_dtype, int gran[2]) {
    const int has_recipe = o->recipe[0] || o->recipe[1] || o->recipe[2];
    const int has_a = o->recipe_a[0] || o->recipe_a[1], has_b = o->recipe_b[0] || o->recipe_b[1];
    if (has_a != has_b || (has_a && has_recipe))
        return 0;
    if (has_b) {
        gran[0] = o->recipe_b[0], gran[1] = o->recipe_b[1];
    } else if (has_recipe) {
        gran[0] = o->recipe[1], gran[1] = o->recipe[2];
    } else {
        gran[0] = sf_dtype == DG_INT32 ? 1 : 128, gran[1] = 128;
    }
    return 1;
}

/* ---- packing -------------------------------------------------------------------------------- */

static PyObject *pack(PyTypeObject *type, PyObject *args, PyObject *kw, const char *fn) {
    static char *kwl[] = {"b", "recipe", "recipe_a", "recipe_b", NULL};
    PyObject *b, *recipe = Py_None, *recipe_a = Py_None, *recipe_b = Py_None;
    char fmt[48];
    snprintf(fmt, sizeof fmt, "O|OOO:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &b, &recipe, &recipe_a, &recipe_b))
        return NULL;
    const int quantized = PyTuple_Check(b) || PyList_Check(b);
    dgp_tensor tb, sfb = {0};
    dg_gemm_options opts;
    if ((quantized ? dgp_pair_from(b, fn, "b", 0, &tb, &sfb) : dgp_tensor_from(b, fn, "b", 0, &tb)) ||
        dgp_gemm_opts(fn, recipe, recipe_a, recipe_b, "nk", 0, &opts))
        return NULL;
    if (!quantized && tb.t.dtype != DG_BFLOAT16) {
        PyErr_Format(PyExc_TypeError,
                     "%s: argument 'b' is a %s tensor without scales; pass BF16 weights alone, FP8/FP4 ones as "
                     "the (data, scales) pair fp8_fp4_gemm_nt takes",
                     fn, dg_dtype_name(tb.t.dtype));
        return NULL;
    }
    if (quantized && tb.t.dtype == DG_BFLOAT16) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'b' pairs bfloat16 data with scales; pass BF16 weights alone", fn);
        return NULL;
    }
    const int recipe_given = recipe != Py_None || recipe_a != Py_None || recipe_b != Py_None;
    if (!quantized && recipe_given) {
        PyErr_Format(PyExc_ValueError,
                     "%s: arguments 'recipe', 'recipe_a', 'recipe_b' apply to FP8/FP4 weights; 'b' is bfloat16", fn);
        return NULL;
    }
    if (tb.t.ndim != 2 && tb.t.ndim != 3) {
        PyErr_Format(PyExc_ValueError,
                     "%s: argument 'b' must be [N, K] (dense GEMMs) or [G, N, K] (m-grouped GEMMs), got %d dimensions",
                     fn, tb.t.ndim);
        return NULL;
    }
    /* Packing fixes only B's granularity; a recipe_b given alone still needs the pair's other
     * half for the library's rule "recipe_a and recipe_b together", and A's is not used here. */
    if (recipe_b != Py_None && recipe_a == Py_None)
        opts.recipe_a[0] = 1, opts.recipe_a[1] = opts.recipe_b[1];

    dgp_packed *self = (dgp_packed *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->dtype = tb.t.dtype;
    self->sf_dtype = quantized ? sfb.t.dtype : DG_FLOAT32;
    self->groups = tb.t.ndim == 3 ? tb.t.shape[0] : 0;
    self->n = tb.t.shape[tb.t.ndim - 2];
    self->k = tb.t.shape[tb.t.ndim - 1] * (tb.t.dtype == DG_FP4_E2M1X2 ? 2 : 1);
    if (quantized && !resolve_gran_b(&opts, self->sf_dtype, self->gran_b))
        self->gran_b[0] = self->gran_b[1] = 0; /* dg_pack_b refuses such arguments below */
    self->isa = dg_get_isa();
    const dg_tensor *sf = quantized ? &sfb.t : NULL;
    dg_status st;
    if (self->groups)
        DGP_NOGIL(st, dg_pack_b_grouped(&tb.t, sf, &opts, &self->handle));
    else
        DGP_NOGIL(st, dg_pack_b(&tb.t, sf, &opts, &self->handle));
    if (st != DG_OK) {
        self->handle = NULL;
        self->freed = 1;
        dgp_raise(st); /* before the object goes: its message is the library's last error */
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *packed_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    return pack(type, args, kw, "PackedB");
}

static PyObject *py_pack_b(PyObject *s, PyObject *args, PyObject *kw) {
    return pack(&dgp_packed_type, args, kw, "pack_b");
}

/* ---- use by the GEMM bindings ---------------------------------------------------------------- */

int dgp_packed_begin(PyObject *obj, const char *fn, const char *arg, int quantized, int grouped,
                     const dg_gemm_options *opts, const dg_packed_b **out) {
    dgp_packed *p = (dgp_packed *)obj;
    if (p->freed) {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' (PackedB) was freed; pack the weights again", fn, arg);
        return -1;
    }
    if ((p->dtype != DG_BFLOAT16) != quantized) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' holds %s weights; pass it to %s", fn, arg,
                     kind_name(p->dtype),
                     quantized ? (grouped ? "the m_grouped_bf16_gemm_nt_* GEMMs" : "bf16_gemm_nt")
                               : (grouped ? "the m_grouped_fp8_fp4_gemm_nt_* GEMMs" : "fp8_fp4_gemm_nt / fp8_gemm_nt"));
        return -1;
    }
    if ((p->groups > 0) != grouped) {
        if (grouped)
            PyErr_Format(PyExc_ValueError,
                         "%s: argument '%s' holds dense weights [%lld, %lld]; m-grouped GEMMs take weights packed "
                         "from [G, N, K]",
                         fn, arg, (long long)p->n, (long long)p->k);
        else
            PyErr_Format(PyExc_ValueError,
                         "%s: argument '%s' holds %lld groups (packed from [G, N, K]); pass it to the m-grouped "
                         "`_nt` GEMMs",
                         fn, arg, (long long)p->groups);
        return -1;
    }
    int gran[2];
    if (quantized && resolve_gran_b(opts, p->sf_dtype, gran) &&
        (gran[0] != p->gran_b[0] || gran[1] != p->gran_b[1])) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the recipe arguments give B granularity (%d, %d), but argument '%s' was packed with "
                     "(%d, %d); pass the recipe given to pack_b",
                     fn, gran[0], gran[1], arg, p->gran_b[0], p->gran_b[1]);
        return -1;
    }
    ++p->in_flight;
    *out = p->handle;
    return 0;
}

int dgp_packed_hold(PyObject *obj, const char *fn, const char *arg, const dg_packed_b **out) {
    dgp_packed *p = (dgp_packed *)obj;
    if (p->freed) {
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' (PackedB) was freed; pack the weights again", fn, arg);
        return -1;
    }
    ++p->in_flight;
    *out = p->handle;
    return 0;
}

void dgp_packed_end(PyObject *obj) {
    dgp_packed *p = (dgp_packed *)obj;
    if (--p->in_flight == 0 && p->freed)
        release_memory(p);
}

/* ---- the object ------------------------------------------------------------------------------ */

static void packed_dealloc(PyObject *obj) {
    release_memory((dgp_packed *)obj); /* no call can be running: each holds a reference */
    Py_TYPE(obj)->tp_free(obj);
}

static PyObject *packed_free(PyObject *obj, PyObject *unused) {
    dgp_packed *p = (dgp_packed *)obj;
    p->freed = 1;
    if (p->in_flight == 0)
        release_memory(p);
    Py_RETURN_NONE;
}

static PyObject *packed_enter(PyObject *obj, PyObject *unused) {
    Py_INCREF(obj);
    return obj;
}

static PyObject *packed_exit(PyObject *obj, PyObject *args) { return packed_free(obj, NULL); }

static PyObject *packed_repr(PyObject *obj) {
    const dgp_packed *p = (const dgp_packed *)obj;
    char shape[96], extra[96] = "";
    if (p->groups)
        snprintf(shape, sizeof shape, "[%lld, %lld, %lld]", (long long)p->groups, (long long)p->n, (long long)p->k);
    else
        snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)p->n, (long long)p->k);
    if (p->dtype != DG_BFLOAT16)
        snprintf(extra, sizeof extra, " recipe_b=(%d, %d) sf=%s", p->gran_b[0], p->gran_b[1],
                 p->sf_dtype == DG_INT32 ? "ue8m0 (int32)" : "float32");
    return PyUnicode_FromFormat("<deep_gemm_cpu.PackedB %s %s%s isa=%s%s>", kind_name(p->dtype), shape, extra,
                                dg_isa_name(p->isa), p->freed ? " freed" : "");
}

static PyObject *get_shape(PyObject *obj, void *unused) {
    const dgp_packed *p = (const dgp_packed *)obj;
    if (p->groups)
        return Py_BuildValue("(LLL)", (long long)p->groups, (long long)p->n, (long long)p->k);
    return Py_BuildValue("(LL)", (long long)p->n, (long long)p->k);
}
static PyObject *get_n(PyObject *obj, void *u) { return PyLong_FromLongLong(((dgp_packed *)obj)->n); }
static PyObject *get_k(PyObject *obj, void *u) { return PyLong_FromLongLong(((dgp_packed *)obj)->k); }
static PyObject *get_groups(PyObject *obj, void *u) { return PyLong_FromLongLong(((dgp_packed *)obj)->groups); }
static PyObject *get_kind(PyObject *obj, void *u) {
    return PyUnicode_FromString(kind_name(((dgp_packed *)obj)->dtype));
}
static PyObject *get_sf_dtype(PyObject *obj, void *u) {
    const dgp_packed *p = (const dgp_packed *)obj;
    if (p->dtype == DG_BFLOAT16)
        Py_RETURN_NONE;
    return PyUnicode_FromString(p->sf_dtype == DG_INT32 ? "int32" : "float32");
}
static PyObject *get_recipe_b(PyObject *obj, void *u) {
    const dgp_packed *p = (const dgp_packed *)obj;
    if (p->dtype == DG_BFLOAT16)
        Py_RETURN_NONE;
    return Py_BuildValue("(ii)", p->gran_b[0], p->gran_b[1]);
}
static PyObject *get_isa(PyObject *obj, void *u) { return PyUnicode_FromString(dg_isa_name(((dgp_packed *)obj)->isa)); }
static PyObject *get_freed(PyObject *obj, void *u) { return PyBool_FromLong(((dgp_packed *)obj)->freed); }

static PyGetSetDef packed_getset[] = {
    {"shape", get_shape, NULL, "b's shape: (N, K), or (G, N, K) for m-grouped weights (K counts FP4 values)", NULL},
    {"n", get_n, NULL, "N (rows of b)", NULL},
    {"k", get_k, NULL, "K (logical: two FP4 values per byte)", NULL},
    {"groups", get_groups, NULL, "G for m-grouped weights, 0 for dense ones", NULL},
    {"kind", get_kind, NULL, "'bf16', 'fp8' or 'fp4': the weights' format", NULL},
    {"sf_dtype", get_sf_dtype, NULL, "'float32' or 'int32' (packed UE8M0) scales; None for BF16", NULL},
    {"recipe_b", get_recipe_b, NULL, "B's (gran_n, gran_k) fixed at packing; None for BF16", NULL},
    {"isa", get_isa, NULL, "the ISA level packed for (get_isa() at packing); calls need the same", NULL},
    {"freed", get_freed, NULL, "True after free()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef packed_methods[] = {
    {"free", packed_free, METH_NOARGS, "free(): release the packed memory now (after running calls end)"},
    {"__enter__", packed_enter, METH_NOARGS, NULL},
    {"__exit__", packed_exit, METH_VARARGS, "frees the packed memory"},
    {NULL, NULL, 0, NULL},
};

#define DGP_PACK_B_SIGNATURE "(b, recipe=None, recipe_a=None, recipe_b=None)"
static PyTypeObject dgp_packed_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "deep_gemm_cpu.PackedB",
    .tp_basicsize = sizeof(dgp_packed),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PackedB" DGP_PACK_B_SIGNATURE "\n--\n\nWeights packed once for the `_nt` GEMMs (see pack_b).",
    .tp_new = packed_new,
    .tp_dealloc = packed_dealloc,
    .tp_repr = packed_repr,
    .tp_getset = packed_getset,
    .tp_methods = packed_methods,
};

int dgp_packed_add_type(PyObject *m) {
    if (PyType_Ready(&dgp_packed_type) < 0)
        return -1;
    Py_INCREF(&dgp_packed_type);
    if (PyModule_AddObject(m, "PackedB", (PyObject *)&dgp_packed_type) < 0) {
        Py_DECREF(&dgp_packed_type);
        return -1;
    }
    return 0;
}

#define KW (PyCFunction)(void (*)(void))
PyMethodDef dgp_packed_methods[] = {
    {"pack_b", KW py_pack_b, METH_VARARGS | METH_KEYWORDS,
     "pack_b" DGP_PACK_B_SIGNATURE "\n--\n\n"
     "Returns a PackedB: the weights b packed once, as the `_nt` GEMMs take b: a BF16 [N, K] tensor, or an "
     "FP8/FP4 (data, scales) pair, [G, N, K] for the m-grouped GEMMs; the recipe arguments as the GEMM calls "
     "will get them. Pass the result in place of b to bf16_gemm_nt, fp8_fp4_gemm_nt and the "
     "m_grouped_*_gemm_nt_* GEMMs: bitwise the unpacked call's D."},
    {NULL, NULL, 0, NULL},
};

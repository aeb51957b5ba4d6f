/*
 * bind_mega.c - the library's single-process Mega MoE references (CPU extras):
 *   fp8_fp4_mega_moe_reference(num_experts, x, topk_idx, topk_weights, l1_weights, l2_weights, y,
 *                              cumulative_local_expert_recv_stats=None, activation_clamp=None)
 *   bf16_mega_moe_reference(...same...)
 * Every per-rank argument is a list with one entry per rank (R = len(x)); in the FP8/FP4 form
 * x, l1_weights and l2_weights entries are DeepGEMM's (data, scales) pairs. DeepGEMM's own
 * fp8_fp4_mega_moe / bf16_mega_moe need a multi-GPU symmetric buffer and are not implemented.
 */
#include "dgpy.h"

#include <math.h>

/* Per-rank descriptors of one list argument (and of the scales of its pairs). */
typedef struct {
    dgp_tensor *t, *sf;
    const dg_tensor **p, **psf;
} rank_list;

static void free_list(rank_list *l) {
    PyMem_Free(l->t);
    PyMem_Free(l->sf);
    PyMem_Free((void *)l->p);
    PyMem_Free((void *)l->psf);
}

/* obj: a list/tuple of R tensors (pairs when `pairs`), or None when optional. */
static int load_list(PyObject *obj, const char *fn, const char *arg, int R, int pairs, int flags, rank_list *l) {
    l->t = PyMem_Calloc((size_t)R, sizeof(dgp_tensor));
    l->sf = PyMem_Calloc((size_t)R, sizeof(dgp_tensor));
    l->p = PyMem_Calloc((size_t)R, sizeof(dg_tensor *));
    l->psf = PyMem_Calloc((size_t)R, sizeof(dg_tensor *));
    if (!l->t || !l->sf || !l->p || !l->psf) {
        PyErr_NoMemory();
        return -1;
    }
    if (obj == Py_None && (flags & DGP_OPTIONAL))
        return 0;
    if (!(PyList_Check(obj) || PyTuple_Check(obj)) || PySequence_Size(obj) != R) {
        PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a list with one entry per rank (%d)", fn, arg, R);
        return -1;
    }
    for (int r = 0; r < R; ++r) {
        char name[96];
        snprintf(name, sizeof name, "%s[%d]", arg, r);
        PyObject *it = PySequence_GetItem(obj, r);
        int rc = !it ? -1
                     : pairs ? dgp_pair_from(it, fn, name, 1, &l->t[r], &l->sf[r])
                             : dgp_tensor_from(it, fn, name, flags & DGP_WRITABLE, &l->t[r]);
        Py_XDECREF(it);
        if (rc)
            return -1;
        l->p[r] = &l->t[r].t;
        l->psf[r] = dgp_ptr(&l->sf[r]);
    }
    return 0;
}

static PyObject *mega_ref(PyObject *args, PyObject *kw, const char *fn, int fp8) {
    static char *kwl[] = {"num_experts", "x", "topk_idx", "topk_weights", "l1_weights", "l2_weights", "y",
                          "cumulative_local_expert_recv_stats", "activation_clamp", NULL};
    int E;
    PyObject *e_obj, *x, *idx, *w, *l1, *l2, *y, *stats = Py_None, *clamp_obj = Py_None;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "OOOOOOO|OO:%s", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &e_obj, &x, &idx, &w, &l1, &l2, &y, &stats, &clamp_obj) ||
        dgp_int(e_obj, fn, "num_experts", &E))
        return NULL;
    Py_ssize_t R = (PyList_Check(x) || PyTuple_Check(x)) ? PySequence_Size(x) : -1;
    if (R <= 0 || R > 4096) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'x' must be a non-empty list with one entry per rank", fn);
        return NULL;
    }
    float clamp = INFINITY;
    if (clamp_obj != Py_None) {
        double v = PyFloat_AsDouble(clamp_obj);
        if (v == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s: argument 'activation_clamp' must be a float or None, got %s", fn,
                             Py_TYPE(clamp_obj)->tp_name);
            }
            return NULL;
        }
        clamp = (float)v;
    }
    rank_list lx = {0}, li = {0}, lw = {0}, l1l = {0}, l2l = {0}, ly = {0}, ls = {0};
    PyObject *res = NULL;
    int n = (int)R;
    if (load_list(x, fn, "x", n, fp8, 0, &lx) || load_list(idx, fn, "topk_idx", n, 0, 0, &li) ||
        load_list(w, fn, "topk_weights", n, 0, 0, &lw) || load_list(l1, fn, "l1_weights", n, fp8, 0, &l1l) ||
        load_list(l2, fn, "l2_weights", n, fp8, 0, &l2l) || load_list(y, fn, "y", n, 0, DGP_WRITABLE, &ly) ||
        load_list(stats, fn, "cumulative_local_expert_recv_stats", n, 0, DGP_OPTIONAL | DGP_WRITABLE, &ls))
        goto done;
    const dg_tensor *const *pstats = stats == Py_None ? NULL : ls.p;
    dg_status st;
    if (fp8)
        DGP_NOGIL(st, dg_fp8_fp4_mega_moe_reference(n, E, lx.p, lx.psf, li.p, lw.p, l1l.p, l1l.psf, l2l.p, l2l.psf,
                                                    ly.p, pstats, clamp));
    else
        DGP_NOGIL(st, dg_bf16_mega_moe_reference(n, E, lx.p, li.p, lw.p, l1l.p, l2l.p, ly.p, pstats, clamp));
    if (st != DG_OK)
        dgp_raise(st);
    else {
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    free_list(&lx), free_list(&li), free_list(&lw), free_list(&l1l), free_list(&l2l), free_list(&ly),
        free_list(&ls);
    return res;
}

static PyObject *py_fp8_fp4_mega_moe_reference(PyObject *s, PyObject *args, PyObject *kw) {
    return mega_ref(args, kw, "fp8_fp4_mega_moe_reference", 1);
}
static PyObject *py_bf16_mega_moe_reference(PyObject *s, PyObject *args, PyObject *kw) {
    return mega_ref(args, kw, "bf16_mega_moe_reference", 0);
}

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
PyMethodDef dgp_mega_methods[] = {
    M(fp8_fp4_mega_moe_reference,
      "fp8_fp4_mega_moe_reference(num_experts, x, topk_idx, topk_weights, l1_weights, l2_weights, y, "
      "cumulative_local_expert_recv_stats=None, activation_clamp=None): R ranks in one process, every "
      "argument a list of R entries; x, l1_weights, l2_weights entries are (data, scales)"),
    M(bf16_mega_moe_reference,
      "bf16_mega_moe_reference(num_experts, x, topk_idx, topk_weights, l1_weights, l2_weights, y, "
      "cumulative_local_expert_recv_stats=None, activation_clamp=None)"),
    {NULL, NULL, 0, NULL},
};

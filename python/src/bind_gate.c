/*
 * bind_gate.c - DeepGEMM 2.8's Mega Gate: bf16_mega_gate (the low-level call: outputs passed in,
 * masks as uint8; deep_gemm_cpu/gate.py gives DeepGEMM's signature, bool masks and returned
 * outputs) and get_bf16_mega_gate_config (a dict with DeepGEMM's keys).
 */
#include "dgpy.h"

#include <string.h>

static PyObject *py_bf16_mega_gate(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "bf16_mega_gate";
    static char *kwl[] = {"x", "weight", "num_topk", "use_shared_as_routed", "num_shared_experts",
                          "routed_scaling_factor", "ep_rank", "scoring_func", "mask", "bias", "image_bias",
                          "image_token_mask", "fix_routing_mask", "to_physical_map", "logical_count",
                          "unmapped_topk_idx", "force_random", "topk_idx", "topk_weights", NULL};
    PyObject *x, *w, *k_obj, *shared_obj, *ns_obj, *scale_obj, *rank_obj, *scoring_obj;
    PyObject *opt_obj[9], *idx_obj, *wt_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOOOOOOOOO:bf16_mega_gate", kwl, &x, &w, &k_obj, &shared_obj,
                                     &ns_obj, &scale_obj, &rank_obj, &scoring_obj, &opt_obj[0], &opt_obj[1],
                                     &opt_obj[2], &opt_obj[3], &opt_obj[4], &opt_obj[5], &opt_obj[6], &opt_obj[7],
                                     &opt_obj[8], &idx_obj, &wt_obj))
        return NULL;
    static const char *opt_names[9] = {"mask", "bias", "image_bias", "image_token_mask", "fix_routing_mask",
                                       "to_physical_map", "logical_count", "unmapped_topk_idx", "force_random"};
    int k, ns, rank;
    if (dgp_int(k_obj, fn, "num_topk", &k) || dgp_int(ns_obj, fn, "num_shared_experts", &ns) ||
        dgp_int(rank_obj, fn, "ep_rank", &rank))
        return NULL;
    const int use_shared = PyObject_IsTrue(shared_obj);
    if (use_shared < 0)
        return NULL;
    if (!PyFloat_Check(scale_obj) && !PyLong_Check(scale_obj)) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'routed_scaling_factor' must be a float, got %s", fn,
                     Py_TYPE(scale_obj)->tp_name);
        return NULL;
    }
    const double scale = PyFloat_AsDouble(scale_obj);
    if (scale == -1.0 && PyErr_Occurred())
        return NULL;
    if (!PyUnicode_Check(scoring_obj)) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'scoring_func' must be a str, got %s", fn,
                     Py_TYPE(scoring_obj)->tp_name);
        return NULL;
    }
    const char *scoring = PyUnicode_AsUTF8(scoring_obj);
    if (!scoring)
        return NULL;
    dgp_tensor tx, tw, topt[9], tidx, twt;
    if (dgp_tensor_from(x, fn, "x", 0, &tx) || dgp_tensor_from(w, fn, "weight", 0, &tw))
        return NULL;
    for (int i = 0; i < 9; ++i) {
        const int writable = i == 7 ? DGP_WRITABLE : 0; /* unmapped_topk_idx is an output */
        if (dgp_tensor_from(opt_obj[i], fn, opt_names[i], DGP_OPTIONAL | writable, &topt[i]))
            return NULL;
    }
    if (dgp_tensor_from(idx_obj, fn, "topk_idx", DGP_WRITABLE, &tidx) ||
        dgp_tensor_from(wt_obj, fn, "topk_weights", DGP_WRITABLE, &twt))
        return NULL;
    dg_status st;
    DGP_NOGIL(st, dg_bf16_mega_gate(&tx.t, &tw.t, k, use_shared, ns, (float)scale, rank, scoring, dgp_ptr(&topt[0]),
                                    dgp_ptr(&topt[1]), dgp_ptr(&topt[2]), dgp_ptr(&topt[3]), dgp_ptr(&topt[4]),
                                    dgp_ptr(&topt[5]), dgp_ptr(&topt[6]), dgp_ptr(&topt[7]), dgp_ptr(&topt[8]),
                                    &tidx.t, &twt.t));
    if (st != DG_OK)
        return dgp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_get_bf16_mega_gate_config(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_bf16_mega_gate_config";
    static char *kwl[] = {"num_tokens", "hidden", "num_routed_experts", "num_topk", NULL};
    PyObject *o[4];
    int64_t v[4];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO:get_bf16_mega_gate_config", kwl, &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    for (int i = 0; i < 4; ++i)
        if (dgp_int64(o[i], fn, kwl[i], &v[i]))
            return NULL;
    dg_mega_gate_config cfg;
    const dg_status st = dg_get_bf16_mega_gate_config(v[0], v[1], v[2], v[3], &cfg);
    if (st != DG_OK)
        return dgp_raise(st);
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i}", "block_tokens", cfg.block_tokens, "num_mma_ctas",
                         cfg.num_mma_ctas, "num_split_k", cfg.num_split_k, "num_expert_groups", cfg.num_expert_groups,
                         "num_gate_warpgroups", cfg.num_gate_warpgroups, "num_sms", cfg.num_sms);
}

#define KW (PyCFunction)(void (*)(void))
PyMethodDef dgp_gate_methods[] = {
    {"bf16_mega_gate", KW py_bf16_mega_gate, METH_VARARGS | METH_KEYWORDS,
     "bf16_mega_gate(x, weight, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, "
     "scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, "
     "unmapped_topk_idx, force_random, topk_idx, topk_weights): the low-level call (masks uint8, outputs given); "
     "use deep_gemm_cpu.bf16_mega_gate"},
    {"get_bf16_mega_gate_config", KW py_get_bf16_mega_gate_config, METH_VARARGS | METH_KEYWORDS,
     "get_bf16_mega_gate_config(num_tokens, hidden, num_routed_experts, num_topk) -> dict of the CPU schedule"},
    {NULL, NULL, 0, NULL},
};

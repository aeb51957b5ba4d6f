/*
 * module.c - deep_gemm_cpu._C: DeepGEMM's `deep_gemm._C` functions over libdeepgemm.
 * The functions live in the bind_*.c tables; DeepGEMM's alias names point to the same objects.
 */
#include "dgpy.h"

static struct PyModuleDef dgp_module = {PyModuleDef_HEAD_INIT, "deep_gemm_cpu._C",
                                        "DeepGEMM's kernel API on CPU tensors (libdeepgemm).", -1, NULL, NULL, NULL, NULL, NULL};

static int add_table(PyObject *m, PyMethodDef *table) {
    return PyModule_AddFunctions(m, table);
}

static int add_alias(PyObject *m, const char *alias, const char *target) {
    PyObject *f = PyObject_GetAttrString(m, target);
    if (!f)
        return -1;
    int rc = PyModule_AddObject(m, alias, f); /* steals f on success */
    if (rc)
        Py_DECREF(f);
    return rc;
}

PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&dgp_module);
    if (!m)
        return NULL;
    static const char *aliases[][2] = {
        {"fp8_gemm_nt", "fp8_fp4_gemm_nt"},
        {"fp8_gemm_nn", "fp8_fp4_gemm_nn"},
        {"fp8_gemm_tn", "fp8_fp4_gemm_tn"},
        {"fp8_gemm_tt", "fp8_fp4_gemm_tt"},
        {"m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous"},
        {"m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous"},
        {"m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked"},
    };
    if (add_table(m, dgp_gemm_methods) || add_table(m, dgp_grouped_methods) || add_table(m, dgp_attn_methods) ||
        add_table(m, dgp_misc_methods) || add_table(m, dgp_quant_methods) || add_table(m, dgp_mega_methods) || add_table(m, dgp_symm_methods) ||
        add_table(m, dgp_packed_methods) || add_table(m, dgp_gate_methods) || dgp_packed_add_type(m))
        goto fail;
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); ++i)
        if (add_alias(m, aliases[i][0], aliases[i][1]))
            goto fail;
    if (PyModule_AddStringConstant(m, "library_version", dg_version_string()))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

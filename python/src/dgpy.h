/*
 * dgpy.h - what the parts of the deep_gemm_cpu._C extension share: turning Python objects
 * (torch CPU tensors, NumPy arrays, tuples, recipes) into dg_tensor descriptors without copying,
 * mapping dg_status to Python exceptions, and allocating outputs through deep_gemm_cpu._alloc.
 *
 * Conventions: every converter takes the Python-visible function name `fn` and argument name
 * `arg` for its messages, returns 0 on success and -1 with a Python exception set.
 */
#ifndef DGPY_H
#define DGPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <deepgemm.h>

/* Converter flags. */
enum {
    DGP_OPTIONAL = 1, /* None is accepted (the tensor is then absent) */
    DGP_WRITABLE = 2  /* the kernel writes it: read-only NumPy arrays are refused */
};

/* One tensor argument: descriptor plus whether it was given. */
typedef struct dgp_tensor {
    dg_tensor t;
    int present;
} dgp_tensor;

/* obj -> descriptor. Torch tensors are read through their attributes (dtype, shape, stride(),
 * data_ptr(), device; CPU only), NumPy-like arrays through __array_interface__ and dtype.name.
 * torch.int8 / numpy int8 become DG_FP4_E2M1X2 (DeepGEMM's packed FP4 tensors). */
int dgp_tensor_from(PyObject *obj, const char *fn, const char *arg, int flags, dgp_tensor *out);
/* A pointer for the library: &t->t when present, NULL otherwise. */
static inline const dg_tensor *dgp_ptr(const dgp_tensor *t) { return t->present ? &t->t : NULL; }
/* DeepGEMM's (data, scales) pair; scales may be None when sf_optional. */
int dgp_pair_from(PyObject *obj, const char *fn, const char *arg, int sf_optional, dgp_tensor *data,
                  dgp_tensor *sf);

/* A tuple of exactly n ints (or None when allow_none: then *given = 0). */
int dgp_int_tuple(PyObject *obj, const char *fn, const char *arg, int n, int allow_none, int *vals, int *given);
/* None or an int; *given says which. */
int dgp_opt_int(PyObject *obj, const char *fn, const char *arg, int *val, int *given);
/* Every integer argument is parsed as an object ("O") and converted by one of these (never by
 * CPython's "i" / "L" formats, whose errors name no argument and include OverflowError): a Python
 * int, a bool or an object with __index__ (NumPy integers, one-element integer tensors) into a C
 * int / int64. Anything else: TypeError "<fn>: argument '<arg>' must be an int, got float";
 * out of range: ValueError "<fn>: argument '<arg>' = <value> does not fit in a 32-bit int"
 * (64-bit for dgp_int64). */
int dgp_int(PyObject *obj, const char *fn, const char *arg, int *val);
int dgp_int64(PyObject *obj, const char *fn, const char *arg, int64_t *val);
/* None, a list/tuple of ints or a 1-D int tensor/array (read once) -> malloc'ed int array. */
int dgp_int_list(PyObject *obj, const char *fn, const char *arg, int **vals, int *count);
/* torch.float32 / torch.bfloat16 / numpy dtype / "bfloat16" ... -> dg_dtype. */
int dgp_dtype_from(PyObject *obj, const char *fn, const char *arg, dg_dtype *out);

/* recipe (3-tuple or None), recipe_a / recipe_b (2-tuples or None) -> opts (defaults first). */
int dgp_gemm_opts(const char *fn, PyObject *recipe, PyObject *recipe_a, PyObject *recipe_b,
                  const char *compiled_dims, int disable_ue8m0_cast, dg_gemm_options *opts);

/* Raises the exception for a failed library call (message: dg_last_error()). Returns NULL. */
PyObject *dgp_raise(dg_status st);

/* A new array shaped like the filled-in query descriptor `t` (dtype, shape, strides), a torch
 * tensor when `like` is one, otherwise a NumPy array; t->data is set to its memory. */
PyObject *dgp_alloc(PyObject *like, dg_tensor *t);
/* The same with a row-major shape. */
PyObject *dgp_alloc_shape(PyObject *like, dg_dtype dtype, int ndim, const int64_t *shape, dg_tensor *t);

/* Runs a library call without the GIL. */
#define DGP_NOGIL(status_var, call)   \
    do {                              \
        Py_BEGIN_ALLOW_THREADS        \
        status_var = (call);          \
        Py_END_ALLOW_THREADS          \
    } while (0)

/* Pre-packed weights (bind_packed.c): is obj a deep_gemm_cpu.PackedB? */
int dgp_is_packed(PyObject *obj);
/* For one GEMM call taking the PackedB obj as argument `arg`: checks that it is live and suits
 * the call (quantized: FP8/FP4 weights, else BF16; grouped: packed from [G, N, K]; for FP8/FP4,
 * that opts give the packing recipe for B) and gives its handle. The handle stays valid until
 * dgp_packed_end(obj), which must follow (with the GIL held) once the call has returned: a
 * free() meanwhile leaves the release of the memory to it. -1 with an exception otherwise
 * (then there is nothing to end). */
int dgp_packed_begin(PyObject *obj, const char *fn, const char *arg, int quantized, int grouped,
                     const dg_gemm_options *opts, const dg_packed_b **out);
void dgp_packed_end(PyObject *obj);
/* The same for a call whose library entry point checks the packed weights itself (the mega
 * MoE's): only that obj is live; dgp_packed_end follows as above. */
int dgp_packed_hold(PyObject *obj, const char *fn, const char *arg, const dg_packed_b **out);
/* Adds the type PackedB to the module. */
int dgp_packed_add_type(PyObject *m);


/* Method tables of the binding files, NULL-terminated. */
extern PyMethodDef dgp_gemm_methods[];
extern PyMethodDef dgp_grouped_methods[];
extern PyMethodDef dgp_attn_methods[];
extern PyMethodDef dgp_misc_methods[];
extern PyMethodDef dgp_quant_methods[];
extern PyMethodDef dgp_mega_methods[];
extern PyMethodDef dgp_symm_methods[];
extern PyMethodDef dgp_packed_methods[];
extern PyMethodDef dgp_gate_methods[];

#endif /* DGPY_H */

/* error.c - per-thread error messages and status names. */
#include "../core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DG_MSG_CAP 512

static _Thread_local char tl_message[DG_MSG_CAP];
static _Thread_local const char *tl_api = "deepgemm";
static _Thread_local int tl_dims = -1; /* the call's compiled_dims (DG_DIM_* bits), -1: not given */

void dg_api_begin(const char *api_name) {
    tl_api = api_name ? api_name : "deepgemm";
    tl_message[0] = '\0';
    tl_dims = -1;
}

void dg_api_set_compiled_dims(const char *dims) {
    int bits = 0;
    for (const char *p = dims; p && *p; ++p)
        bits |= *p == 'm' ? DG_DIM_M : *p == 'n' ? DG_DIM_N : *p == 'k' ? DG_DIM_K : 0;
    tl_dims = dims ? bits : -1;
}

int dg_api_compiled_dims(void) { return tl_dims; }

const char *dg_api_name(void) { return tl_api; }

dg_api_context dg_api_save(void) { return (dg_api_context){tl_api, tl_dims}; }

void dg_api_adopt(dg_api_context ctx) { /* the message stays the worker's own */
    tl_api = ctx.api;
    tl_dims = ctx.dims;
}

dg_status dg_fail(dg_status status, const char *fmt, ...) {
    int n = snprintf(tl_message, DG_MSG_CAP, "%s: ", tl_api);
    if (n < 0 || n >= DG_MSG_CAP)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_message + n, (size_t)(DG_MSG_CAP - n), fmt, ap);
    va_end(ap);
    return status;
}

const char *dg_last_error(void) { return tl_message; }

const char *dg_status_string(dg_status status) {
    switch (status) {
    case DG_OK: return "DG_OK";
    case DG_ERR_NULL_POINTER: return "DG_ERR_NULL_POINTER";
    case DG_ERR_DTYPE: return "DG_ERR_DTYPE";
    case DG_ERR_SHAPE: return "DG_ERR_SHAPE";
    case DG_ERR_LAYOUT: return "DG_ERR_LAYOUT";
    case DG_ERR_VALUE: return "DG_ERR_VALUE";
    case DG_ERR_OVERFLOW: return "DG_ERR_OVERFLOW";
    case DG_ERR_ALLOC: return "DG_ERR_ALLOC";
    case DG_ERR_UNSUPPORTED: return "DG_ERR_UNSUPPORTED";
    case DG_ERR_INTERNAL: return "DG_ERR_INTERNAL";
    case DG_ERR_COMM: return "DG_ERR_COMM";
    }
    return "DG_ERR_UNKNOWN";
}

const char *dg_version_string(void) {
#define DG_STR2(x) #x
#define DG_STR(x) DG_STR2(x)
    return DG_STR(DG_VERSION_MAJOR) "." DG_STR(DG_VERSION_MINOR) "." DG_STR(DG_VERSION_PATCH);
}

/*
 * fuzz_common.h - shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.c).
 *
 * A harness reads its fuzz input as a stream of decisions: which entry point, a small
 * vocabulary of dimensions (so that tensors often agree, and the checks past the first one are
 * reached), then for every tensor argument its dtype, shape, strides and data. Each tensor gets
 * a heap buffer of exactly the bytes its shape and strides address (lowest to highest element,
 * negative strides included), so AddressSanitizer reports any access outside what the
 * descriptor claims. Descriptors whose span the library must refuse (over 2^56 bytes, or not
 * computable in 64 bits) get a 16-byte buffer: reading more than that is a bug. Spans between
 * FZ_MAX_SPAN and 2^56 are valid but too large to back; such inputs are skipped.
 *
 * After every call: an error status must come with a message naming the function, and outputs
 * must be unchanged (the library checks everything before writing). Any violation aborts.
 */
#ifndef DG_FUZZ_COMMON_H
#define DG_FUZZ_COMMON_H

#include <deepgemm.h>
#include <math.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* each harness uses a part of this file */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_MAX_SPAN ((int64_t)1 << 14) /* bytes one tensor may back (keeps valid calls small and fast) */
#define FZ_MAX_LOGICAL ((int64_t)1 << 22) /* logical bytes of a broadcast tensor, see fz_back */
#define FZ_MAX_TENSORS 16
#define FZ_VOCAB 6

typedef struct fz_reader {
    const uint8_t *p;
    size_t n, i;
} fz_reader;

static inline uint8_t fz_u8(fz_reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static inline uint16_t fz_u16(fz_reader *r) { return (uint16_t)(fz_u8(r) | (fz_u8(r) << 8)); }
static inline uint32_t fz_u32(fz_reader *r) { return (uint32_t)fz_u16(r) | ((uint32_t)fz_u16(r) << 16); }
static inline uint64_t fz_u64(fz_reader *r) { return (uint64_t)fz_u32(r) | ((uint64_t)fz_u32(r) << 32); }

/* Values that sit on the edges of the library's arithmetic. */
static const int64_t fz_special[] = {
    -1, 0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1024,
    (int64_t)1 << 31, ((int64_t)1 << 31) - 1, (int64_t)1 << 32, (int64_t)1 << 40, (int64_t)1 << 55,
    (int64_t)1 << 56, (int64_t)1 << 62, ((int64_t)1 << 62) + 1, INT64_MAX, INT64_MIN, -2, -128,
    -((int64_t)1 << 31), 7168, 2112, 4096};
#define FZ_NSPECIAL ((int)(sizeof fz_special / sizeof fz_special[0]))

/* A dimension: mostly small, sometimes an edge value. */
static inline int64_t fz_dim(fz_reader *r) {
    uint8_t b = fz_u8(r);
    if (b < 200)
        return b % 40;
    if (b < 240)
        return fz_special[(b - 200) % FZ_NSPECIAL];
    return (int64_t)fz_u64(r);
}

/* A scalar int argument (granularities, counts, flags). */
static inline int fz_int(fz_reader *r) {
    uint8_t b = fz_u8(r);
    if (b < 160)
        return b % 12;
    if (b < 240) {
        int64_t v = fz_special[(b - 160) % FZ_NSPECIAL];
        return (int)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v);
    }
    return (int)fz_u32(r);
}

/* A granularity: the values the recipes use, sometimes anything. */
static inline int fz_gran(fz_reader *r) {
    static const int g[] = {0, 1, 32, 128, 64, 16, 256, 2, 3, -1, 127, 129, 1 << 30, INT32_MAX, 4, 8};
    return g[fz_u8(r) % 16];
}

typedef struct fz_ctx {
    fz_reader r;
    int64_t vocab[FZ_VOCAB];
    void *bufs[FZ_MAX_TENSORS];
    int nbufs;
    /* outputs: copies to compare after a failing call */
    struct {
        const dg_tensor *t;
        void *base, *copy;
        size_t nbytes;
    } outs[FZ_MAX_TENSORS];
    int nouts;
    int skip; /* a tensor too large to back: the input is not run */
} fz_ctx;

static inline void fz_init(fz_ctx *c, const uint8_t *data, size_t size) {
    memset(c, 0, sizeof *c);
    c->r.p = data, c->r.n = size;
    for (int i = 0; i < FZ_VOCAB; ++i)
        c->vocab[i] = fz_dim(&c->r);
}

/* A dimension from the vocabulary (most of the time) or a fresh one. */
static inline int64_t fz_vdim(fz_ctx *c, int slot) {
    uint8_t b = fz_u8(&c->r);
    if (b < 176)
        return c->vocab[slot % FZ_VOCAB];
    if (b < 224)
        return c->vocab[b % FZ_VOCAB];
    if (b < 240)
        return (int64_t)((uint64_t)c->vocab[slot % FZ_VOCAB] * (uint64_t)(b % 4 + 1) + (b & 8 ? 1 : 0)); /* wraps */
    return fz_dim(&c->r);
}

static void *fz_alloc(fz_ctx *c, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    if (c->nbufs < FZ_MAX_TENSORS * 2)
        c->bufs[c->nbufs++] = p;
    return p;
}

enum { FZ_FILL_FLOAT = 0, FZ_FILL_INDEX = 1 };

/* Fill n bytes: zeros, a pattern of sane values, raw pseudo-random bytes, or small integers. */
static void fz_fill(fz_ctx *c, uint8_t *p, size_t n, dg_dtype dt, int kind) {
    uint8_t mode = fz_u8(&c->r);
    uint32_t s = 0x9e3779b9u ^ ((uint32_t)mode * 0x85ebca6bu) ^ (uint32_t)c->r.i;
    if (kind == FZ_FILL_INDEX || mode % 4 == 3) {
        /* small integers read from the input (cycled), in the dtype's width */
        int64_t vals[16];
        int nv = 1 + fz_u8(&c->r) % 16;
        for (int i = 0; i < nv; ++i) {
            uint8_t b = fz_u8(&c->r);
            vals[i] = b < 224 ? (int64_t)(b % 40) - 1 : fz_special[b % FZ_NSPECIAL];
        }
        size_t es = dg_dtype_size(dt);
        if (es != 4 && es != 8)
            es = 1;
        for (size_t i = 0; i + es <= n; i += es) {
            int64_t v = vals[(i / es) % (size_t)nv];
            if (es == 4) {
                int32_t w = (int32_t)v;
                memcpy(p + i, &w, 4);
            } else if (es == 8) {
                memcpy(p + i, &v, 8);
            } else {
                p[i] = (uint8_t)v;
            }
        }
        for (size_t i = n - n % es; i < n; ++i)
            p[i] = 0;
        return;
    }
    switch (mode % 4) {
    case 0:
        memset(p, 0, n);
        break;
    case 1: /* finite values of moderate size in every dtype */
        for (size_t i = 0; i < n; ++i) {
            s = s * 1664525u + 1013904223u;
            p[i] = (uint8_t)(s >> 24);
        }
        if (dt == DG_FLOAT32)
            for (size_t i = 0; i + 4 <= n; i += 4) {
                s = s * 1664525u + 1013904223u;
                float f = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
                memcpy(p + i, &f, 4);
            }
        else if (dt == DG_BFLOAT16)
            for (size_t i = 0; i + 2 <= n; i += 2) {
                s = s * 1664525u + 1013904223u;
                uint16_t h = dg_float_to_bf16(((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f);
                memcpy(p + i, &h, 2);
            }
        else if (dt == DG_FLOAT8_E4M3)
            for (size_t i = 0; i < n; ++i)
                p[i] &= 0x77; /* no NaN codes */
        else if (dt == DG_UE8M0 || dt == DG_INT32)
            for (size_t i = 0; i < n; ++i)
                p[i] = (uint8_t)(120 + p[i] % 16); /* scales near 1 */
        break;
    default: /* raw bytes: NaN, inf, denormals, anything */
        for (size_t i = 0; i < n; ++i) {
            s = s * 1664525u + 1013904223u;
            p[i] = (uint8_t)(s >> 24);
        }
    }
}

/* lo/hi element offsets of t; 0 when they do not fit in int64 (then *ok = 0). */
static int fz_span(const dg_tensor *t, int64_t *lo_out, int64_t *hi_out) {
    int64_t lo = 0, hi = 0;
    if (t->ndim < 0 || t->ndim > DG_MAX_DIMS)
        return 0;
    for (int i = 0; i < t->ndim; ++i) {
        if (t->shape[i] < 0)
            return 0;
        if (t->shape[i] == 0) {
            *lo_out = 0, *hi_out = -1; /* empty: no element */
            return 1;
        }
    }
    for (int i = 0; i < t->ndim; ++i) {
        int64_t off;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &off))
            return 0;
        if (off < 0) {
            if (__builtin_add_overflow(lo, off, &lo))
                return 0;
        } else if (__builtin_add_overflow(hi, off, &hi)) {
            return 0;
        }
    }
    *lo_out = lo, *hi_out = hi;
    return 1;
}

/* Bytes t addresses (0 when empty) and its lowest element offset; 0 when not computable. */
static int fz_bytes(const dg_tensor *t, int64_t *lo, int64_t *bytes) {
    size_t es = dg_dtype_size(t->dtype);
    if (es == 0)
        es = 1;
    int64_t hi, elems;
    if (!fz_span(t, lo, &hi))
        return 0;
    if (hi < *lo) {
        *lo = 0, *bytes = 0;
        return 1;
    }
    return !__builtin_sub_overflow(hi, *lo, &elems) && !__builtin_add_overflow(elems, 1, &elems) &&
           !__builtin_mul_overflow(elems, (int64_t)es, bytes);
}

/* Back t->data with exactly the bytes it addresses (see the top of this file). */
static void fz_back(fz_ctx *c, dg_tensor *t, int kind) {
    size_t es = dg_dtype_size(t->dtype);
    if (es == 0)
        es = 1;
    int64_t lo = 0, bytes = 0;
    int ok = fz_bytes(t, &lo, &bytes);
    if (!ok || bytes > ((int64_t)1 << 56)) { /* the library must refuse it from the descriptor */
        t->data = fz_alloc(c, 16);
        memset(t->data, 0, 16);
        return;
    }
    /* Broadcast (stride 0) descriptors may claim far more elements than they span. Calls on
     * them are valid and do work in proportion to the logical size, so inputs claiming more
     * than FZ_MAX_LOGICAL bytes are skipped, unless the logical size is over 2^56 bytes, which
     * no output or workspace could hold: those the library must refuse at once. */
    int64_t numel = 1, logical;
    int fits = 1;
    for (int i = 0; i < t->ndim && fits; ++i)
        fits = !__builtin_mul_overflow(numel, t->shape[i], &numel);
    fits = fits && !__builtin_mul_overflow(numel, (int64_t)es, &logical);
    if (bytes > FZ_MAX_SPAN || (fits && logical > FZ_MAX_LOGICAL && logical <= ((int64_t)1 << 56))) {
        c->skip = 1;
        t->data = fz_alloc(c, 16);
        return;
    }
    uint8_t *base = fz_alloc(c, (size_t)bytes);
    fz_fill(c, base, (size_t)bytes, t->dtype, kind);
    t->data = base - lo * (int64_t)es; /* negative strides reach below data */
    if (bytes == 0)
        t->data = base;
}

/*
 * A tensor argument. `dt` and the `nd` dims in `slots` (vocabulary slots; -1 = any) are what
 * the entry point expects; the input decides whether to keep them, and how to lay it out:
 * row-major, last two dimensions swapped in memory (MN-major), padded rows, broadcast (stride
 * 0), or raw strides. Returns NULL ("None") or the descriptor, stored in *t.
 */
static dg_tensor *fz_tensor(fz_ctx *c, dg_tensor *t, dg_dtype dt, int nd, const int *slots, int kind) {
    fz_reader *r = &c->r;
    uint8_t m = fz_u8(r);
    memset(t, 0, sizeof *t);
    if (m >= 250)
        return NULL;
    t->dtype = dt;
    if (m >= 230)
        t->dtype = (dg_dtype)(fz_u8(r) % (DG_DTYPE_COUNT + 1));
    t->ndim = nd;
    if (m >= 240)
        t->ndim = (int)(fz_u8(r) % (DG_MAX_DIMS + 2)) - (m == 249); /* -1 .. 7 */
    int nds = t->ndim < 0 ? 0 : t->ndim > DG_MAX_DIMS ? DG_MAX_DIMS : t->ndim;
    for (int i = 0; i < nds; ++i)
        t->shape[i] = (i < nd && slots && slots[i] >= 0) ? fz_vdim(c, slots[i]) : fz_dim(r);
    /* row-major strides */
    int64_t st = 1;
    for (int i = nds - 1; i >= 0; --i) {
        t->strides[i] = st;
        if (__builtin_mul_overflow(st, t->shape[i] > 0 ? t->shape[i] : 1, &st))
            st = INT64_MAX / 2;
    }
    uint8_t lay = fz_u8(r);
    if (lay >= 160 && lay < 192 && nds >= 2) { /* MN-major: memory order of the last two swapped */
        int64_t a = t->shape[nds - 2], b = t->shape[nds - 1];
        t->strides[nds - 2] = 1;
        t->strides[nds - 1] = a > 0 ? a : 1;
        (void)b;
        int64_t outer = (a > 0 ? a : 1);
        if (__builtin_mul_overflow(outer, b > 0 ? b : 1, &outer))
            outer = INT64_MAX / 2;
        for (int i = nds - 3; i >= 0; --i) {
            t->strides[i] = outer;
            if (__builtin_mul_overflow(outer, t->shape[i] > 0 ? t->shape[i] : 1, &outer))
                outer = INT64_MAX / 2;
        }
    } else if (lay >= 192 && lay < 212 && nds >= 2) { /* padded rows */
        int64_t pad = fz_u8(r) % 9;
        int64_t s2;
        if (__builtin_add_overflow(t->strides[nds - 2], pad, &s2))
            s2 = INT64_MAX / 2;
        int64_t o = s2;
        t->strides[nds - 2] = s2;
        for (int i = nds - 3; i >= 0; --i) {
            if (__builtin_mul_overflow(o, t->shape[i + 1] > 0 ? t->shape[i + 1] : 1, &o))
                o = INT64_MAX / 2;
            t->strides[i] = o;
        }
    } else if (lay >= 212 && lay < 224 && nds >= 1) { /* one dimension broadcast */
        t->strides[fz_u8(r) % nds] = 0;
    } else if (lay >= 224) { /* raw strides */
        for (int i = 0; i < nds; ++i) {
            uint8_t b = fz_u8(r);
            t->strides[i] = b < 200 ? (int64_t)(b % 20) - 4 : fz_special[b % FZ_NSPECIAL];
        }
    }
    uint8_t dm = fz_u8(r);
    if (dm >= 248) {
        t->data = NULL;
        return t;
    }
    fz_back(c, t, kind);
    if (dm >= 240 && t->data) /* misaligned by one byte, same span */ {
        size_t es = dg_dtype_size(t->dtype);
        int64_t lo, bytes;
        if (es > 1 && fz_bytes(t, &lo, &bytes) && bytes > 0 && bytes <= FZ_MAX_SPAN) {
            uint8_t *base = fz_alloc(c, (size_t)bytes + 1);
            fz_fill(c, base + 1, (size_t)bytes, t->dtype, kind);
            t->data = base + 1 - lo * (int64_t)es;
        }
    }
    return t;
}

/* After a query-form call filled *t (data NULL): back it exactly; 0 when too large. */
static int fz_answer(fz_ctx *c, dg_tensor *t) {
    int64_t lo, bytes;
    size_t es = dg_dtype_size(t->dtype);
    if (es == 0)
        es = 1;
    if (!fz_bytes(t, &lo, &bytes) || bytes > FZ_MAX_SPAN)
        return 0;
    uint8_t *base = fz_alloc(c, (size_t)bytes);
    memset(base, 0xA5, (size_t)bytes);
    t->data = base - lo * (int64_t)es;
    return 1;
}

/* A query form answered, then the call on that answer failed other than for the inputs'
 * values (which a query need not read) or memory: the two disagree. */
static void fz_expect_ok(dg_status st, const char *fn) {
    if (st != DG_OK && st != DG_ERR_VALUE && st != DG_ERR_ALLOC) {
        fprintf(stderr, "%s: the query form answered, but the call with its answer failed: %s\n", fn,
                dg_last_error());
        abort();
    }
}

/* Mark t (may be NULL, or have NULL data) as an output: it must not change on failure. */
static void fz_output(fz_ctx *c, const dg_tensor *t) {
    if (!t || !t->data || c->nouts >= FZ_MAX_TENSORS)
        return;
    int64_t lo, bytes;
    size_t es = dg_dtype_size(t->dtype);
    if (es == 0)
        es = 1;
    if (!fz_bytes(t, &lo, &bytes) || bytes > FZ_MAX_SPAN || bytes <= 0)
        return;
    int i = c->nouts++;
    c->outs[i].t = t;
    c->outs[i].base = (uint8_t *)t->data + lo * (int64_t)es;
    c->outs[i].nbytes = (size_t)bytes;
    c->outs[i].copy = malloc((size_t)bytes);
    if (!c->outs[i].copy)
        abort();
    memcpy(c->outs[i].copy, c->outs[i].base, (size_t)bytes);
}

/* Check a call's result (see the top of this file) and free everything. */
static void fz_finish(fz_ctx *c, dg_status st, const char *fn) {
    if (st != DG_OK) {
        const char *msg = dg_last_error();
        if (!msg || !*msg) {
            fprintf(stderr, "%s: status %s without a message\n", fn, dg_status_string(st));
            abort();
        }
        if (st < DG_OK || st > DG_ERR_INTERNAL) {
            fprintf(stderr, "%s: unknown status %d\n", fn, (int)st);
            abort();
        }
        if (st == DG_ERR_INTERNAL) {
            fprintf(stderr, "%s: DG_ERR_INTERNAL: %s\n", fn, msg);
            abort();
        }
        for (int i = 0; i < c->nouts; ++i)
            if (memcmp(c->outs[i].copy, c->outs[i].base, c->outs[i].nbytes) != 0) {
                fprintf(stderr, "%s failed (%s: %s) but wrote output %d\n", fn, dg_status_string(st), msg, i);
                abort();
            }
    }
    for (int i = 0; i < c->nouts; ++i)
        free(c->outs[i].copy);
    for (int i = 0; i < c->nbufs; ++i)
        free(c->bufs[i]);
    c->nouts = c->nbufs = 0;
}

/* Options from the input: no options, DeepGEMM's defaults, or fuzzed fields. */
static const dg_gemm_options *fz_options(fz_ctx *c, dg_gemm_options *o) {
    uint8_t m = fz_u8(&c->r);
    *o = dg_gemm_options_default();
    if (m < 96)
        return NULL;
    if (m < 128)
        return o;
    uint8_t which = fz_u8(&c->r);
    if (which & 1)
        for (int i = 0; i < 3; ++i)
            o->recipe[i] = fz_gran(&c->r);
    if (which & 2)
        for (int i = 0; i < 2; ++i)
            o->recipe_a[i] = fz_gran(&c->r);
    if (which & 4)
        for (int i = 0; i < 2; ++i)
            o->recipe_b[i] = fz_gran(&c->r);
    if (which & 8)
        o->use_psum_layout = fz_u8(&c->r) % 3;
    if (which & 16)
        o->ensure_zero_padding = fz_u8(&c->r) % 3;
    if (which & 32)
        o->expected_m_for_psum_layout = fz_int(&c->r);
    if (which & 64)
        o->disable_ue8m0_cast = 1;
    if (which & 128) { /* alpha: finite, or NaN / infinity (rejected) */
        static const float kAlpha[6] = {0.5f, -1.0f, 0.0f, 3.0e38f, NAN, INFINITY};
        o->has_alpha = 1;
        o->alpha = kAlpha[fz_u8(&c->r) % 6];
    }
    return o;
}

/* Library settings picked by the input: backend and ISA cap (each call's own choice). */
static void fz_settings(fz_ctx *c) {
    static int inited;
    static dg_isa best;
    if (!inited) {
        dg_cpu_info info;
        dg_set_num_sms(1); /* libFuzzer runs one input at a time; keep it single-threaded */
        best = dg_get_cpu_info(&info) == DG_OK ? info.best_isa : DG_ISA_GENERIC;
        inited = 1;
    }
    uint8_t b = fz_u8(&c->r);
    dg_set_backend((b & 1) ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
    dg_isa want = (dg_isa)((b >> 1) % 5);
    dg_set_isa(best); /* each input's choice alone, whatever the previous input set */
    if (want < best)
        dg_set_isa(want);
}

#endif /* DG_FUZZ_COMMON_H */

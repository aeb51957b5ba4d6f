/*
 * hc_prenorm.c - driver of the fast dg_tf32_hc_prenorm_gemm (see hc_prenorm_kernels.h).
 *
 * Work: the (row, split) pairs, cut into equal contiguous ranges, one per thread (OpenMP when
 * the library is built with it, else pthreads; the calling thread takes part): row-major
 * (blocks of at most HC_MB rows, one split after the other) or, when M fits one block,
 * split-major (whole splits per thread). For a block it keeps
 * each row's partial sums in a state array (lanes x (24 columns + square sum) floats per row,
 * in L2) and walks the split's K range in chunks of the kernel's kc: it copies B's chunk into the L1
 * panel once, then for each group of `rows` rows converts their A chunk to float32 and runs the
 * micro kernel over the panel's column groups. A is read from memory once, B once per block;
 * software prefetches fetch the next rows of A and the next chunk of B while the FMAs run.
 * Determinism: a row's sums depend only on the row, its K range and the ISA's lane count, never
 * on the block or thread that computes it; K is never divided except by the caller's splits.
 *
 * At the AMX level (N <= HC_AMX_MAX_N) the tile kernels of hc_prenorm_kernels.h run instead,
 * on units of work the threads take from a shared counter (amx_run_units): each thread packs the
 * pieces of B it reaches (no thread waits for another), then walks each piece over groups of 16
 * rows; row ranges of at most HC_AMX_FEW_ROWS rows (decode) skip the packing and take the
 * transposed kernel, which gives the same bits, with the threads sharing B's columns when there
 * are fewer splits than threads (each then reads only its columns' part of B).
 */
#include "hc_prenorm_kernels.h"

#include "../reference/ref_hc.h"

#include <pthread.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define HC_MB 256 /* rows per block: their state (400 KiB) stays in L2; B is packed once per block */
#define HC_MIN_FLOPS_PER_THREAD 4e6 /* below this a thread costs more than it saves */
/* Bytes of B a thread streams in about the time of HC_MIN_FLOPS_PER_THREAD FMAs' work (~20 us
 * at 10 GB/s per core): what a thread must save to be worth starting at decode sizes. */
#define HC_B_BYTES_PER_FLOPS_UNIT (256.0 * 1024.0)

const dg_hc_kernel *dg_hc_kernel_for(dg_isa isa) {
#define KERNEL(isa, ISA, fin)                                                                            \
    {#isa, DG_HC_LANES_##ISA, DG_HC_ROWS_##ISA, DG_HC_COLS_##ISA, DG_HC_KC_##ISA, DG_HC_LD_##ISA,         \
     dg_hc_pack_##isa, dg_hc_convert_##isa, dg_hc_micro_##isa, fin}
    static const dg_hc_kernel generic = KERNEL(generic, GENERIC, dg_hc_finish_generic);
#if DG_HC_HAVE_X86_KERNELS
    static const dg_hc_kernel avx2 = KERNEL(avx2, AVX2, dg_hc_finish_generic);
    static const dg_hc_kernel avx512 = KERNEL(avx512, AVX512, dg_hc_finish_avx512);
    if (isa >= DG_ISA_AVX512)
        return &avx512;
    if (isa >= DG_ISA_AVX2)
        return &avx2;
#endif
#undef KERNEL
    (void)isa;
    return &generic;
}

typedef struct hc_job {
    const dg_hc_kernel *kern;
    const uint16_t *a;
    const float *b;
    float *d, *s;
    int64_t lda, ldb, ldd, d_split, s_split; /* element strides */
    int64_t m, n, k;
    int splits, threads;
    int col_parts; /* > 1: threads share the columns of one split (decode sizes), see run_thread */
    int64_t state_floats; /* per row, DG_HC_STATE(lanes) */
    size_t scratch_floats; /* per thread: panel, converted A, then min(M, HC_MB) row states */
    float *scratch;
    /* AMX: per thread, packed B (steps k steps of 32 per panel of DG_HC_NS columns), filled as
     * the thread reaches each piece, then the row states */
    bool amx;
    int64_t steps, panels, kc; /* kc: K per chunk */
    size_t bp_floats; /* packed B and its flags */
    size_t state_floats_amx; /* the row states */
    int64_t slots; /* splits that can end in one chunk: the staging area's planes */
    int64_t *next_unit; /* the AMX work counter */
} hc_job;

/* Hints part `part` of `parts` of the next chunk's B rows (what pack will read) into the cache,
 * so that the panel copy finds them there. */
static void prefetch_b(const hc_job *j, int64_t ns0, int64_t nsc, int64_t kc, int64_t len, int64_t part,
                       int64_t parts) {
    const int64_t lines = dg_ceil_div(len, 16), total = nsc * lines, per = dg_ceil_div(total, parts);
    const int64_t t1 = (part + 1) * per < total ? (part + 1) * per : total;
    for (int64_t t = part * per; t < t1; ++t)
        __builtin_prefetch(j->b + (ns0 + t / lines) * j->ldb + kc + (t % lines) * 16);
}

/* Rows [r0, r1) of split sp, columns [ns0, ns0 + nsc). */
static void run_block_columns(const hc_job *j, float *scratch, int sp, int64_t r0, int64_t r1, int64_t ns0,
                              int64_t nsc) {
    const dg_hc_kernel *kn = j->kern;
    const int64_t KC = kn->kc, LD = kn->ld;
    float *pk = scratch, *xa = pk + (size_t)DG_HC_NS * LD, *state = xa + (size_t)kn->rows * LD;
    const int64_t sf = j->state_floats, groups = dg_ceil_div(nsc, kn->cols);
    int64_t k0, k1;
    dg_hc_split_range(j->k, j->splits, sp, &k0, &k1);
    if (k0 == k1) /* a split without blocks: its sums are zero */
        memset(state, 0, (size_t)((r1 - r0) * sf) * sizeof(float));
    for (int64_t kc = k0; kc < k1; kc += KC) {
        const int64_t len = k1 - kc < KC ? k1 - kc : KC;
        const int first = kc == k0;
        const int64_t next_kc = kc + KC, next_len = k1 - next_kc < KC ? k1 - next_kc : KC;
        const int64_t row_groups = dg_ceil_div(r1 - r0, kn->rows);
        kn->pack(j->b + ns0 * j->ldb + kc, j->ldb, nsc, len, pk);
        for (int64_t r = r0; r < r1; r += kn->rows) {
            const int rows = (int)(r1 - r < kn->rows ? r1 - r : kn->rows);
            float *st = state + (r - r0) * sf;
            kn->convert(j->a + r * j->lda + kc, j->lda, rows, len, xa, st + DG_HC_NS * kn->lanes, sf, first);
            if (next_len > 0)
                prefetch_b(j, ns0, nsc, next_kc, next_len, (r - r0) / kn->rows, row_groups);
            for (int64_t g = 0; g < groups; ++g) {
                /* Column group g hints one row of the next row group (wrapping to the block's
                 * first rows in the next chunk), so A arrives while this group computes. */
                int64_t pr = r + rows + g, pk_c = kc;
                if (pr >= r1)
                    pr = r0 + (pr - r1), pk_c = next_kc;
                const uint16_t *pf = g < kn->rows && pr < r1 && pk_c < k1 ? j->a + pr * j->lda + pk_c : NULL;
                kn->micro(xa, rows, dg_align(len, 16), pk + g * kn->cols * LD, st + g * kn->cols * kn->lanes,
                          sf, first, pf);
            }
        }
    }
    for (int64_t r = r0; r < r1; ++r) {
        float out[DG_HC_NS + 1];
        kn->finish(state + (r - r0) * sf, out);
        memcpy(j->d + sp * j->d_split + r * j->ldd + ns0, out, (size_t)nsc * sizeof(float));
        if (ns0 == 0)
            j->s[sp * j->s_split + r] = out[DG_HC_NS];
    }
}

#if DG_HC_HAVE_AMX
/* K per chunk of the AMX path: the chunk's packed B (160 bytes per k) stays in L2 while blocks of
 * rows stream A past it; the rows' state is stored and reloaded between chunks (exactly). Long
 * row pieces stream best (one chunk for K <= 8192, 1.3 MiB of B, ran M = 8192, K = 7168 ~25%
 * faster than chunks of 4096); past that, 6144 (3 pages of A per row piece, 0.94 MiB of B) was
 * measured fastest at K = 28672 among 4096-8192 (by 15-25%). */
#define HC_AMX_KC_WHOLE 8192
#define HC_AMX_KC 6144
#define HC_AMX_MAX_N (4 * DG_HC_NS)
/* Up to this many rows (of one split) take dg_hc_amx_block_t: converting B per 16 rows costs less
 * than packing it. Either kernel gives the same bits. */
#define HC_AMX_FEW_ROWS 48

/* Scratch of one AMX thread: packed B, one flag per (panel, k step) starting a packed piece,
 * then the row states. Each thread packs what it uses (no thread waits for another); a piece
 * (split, chunk) is the same for every thread, so its flag marks it whole. */
static uint16_t *amx_bp(float *scratch) { return (uint16_t *)scratch; }
static uint8_t *amx_flags(const hc_job *j, float *scratch) {
    return (uint8_t *)(amx_bp(scratch) + j->panels * j->steps * DG_HC_AMX_STEP);
}

/* Rows [r0, r1) of split sp on the AMX path: per panel, the split's K chunk by chunk, each
 * chunk over blocks of DG_HC_AMX_ROWS rows; then the outputs. */
static void amx_rows(const hc_job *j, float *scratch, int sp, int64_t r0, int64_t r1) {
    const bool few = r1 - r0 <= HC_AMX_FEW_ROWS;
    int cfg_rows = 0; /* the block configuration loaded (0: none) */
    float *state = scratch + j->bp_floats;
    uint8_t *flags = amx_flags(j, scratch);
    int64_t k0, k1;
    dg_hc_split_range(j->k, j->splits, sp, &k0, &k1);
    for (int64_t p = 0; p < j->panels; ++p) {
        uint16_t *bp = amx_bp(scratch) + p * j->steps * DG_HC_AMX_STEP;
        const int64_t ns0 = p * DG_HC_NS, nsc = j->n - ns0 < DG_HC_NS ? j->n - ns0 : DG_HC_NS;
        for (int64_t r = r0; few && r < r1; r += 16)
            dg_hc_amx_block_t(j->a + r * j->lda, j->lda, (int)(r1 - r < 16 ? r1 - r : 16), k0, k1, j->b + ns0 * j->ldb,
                              j->ldb, nsc, state + (r - r0) * DG_HC_AMX_SF, p == 0);
        /* an empty split still zeroes */
        for (int64_t kc = k0; !few && (kc == k0 || kc < k1); kc += j->kc) {
            const int64_t kce = k1 - kc < j->kc ? k1 : kc + j->kc;
            if (kc < kce && !flags[p * j->steps + kc / 32]) {
                dg_hc_amx_pack_b(j->b + ns0 * j->ldb, j->ldb, nsc, j->k, kc / 32, dg_ceil_div(kce, 32), bp);
                flags[p * j->steps + kc / 32] = 1;
            }
            for (int64_t r = r0; r < r1; r += DG_HC_AMX_ROWS) {
                const int rows = (int)(r1 - r < DG_HC_AMX_ROWS ? r1 - r : DG_HC_AMX_ROWS);
                if (rows != cfg_rows)
                    dg_hc_amx_config(cfg_rows = rows);
                dg_hc_amx_block(j->a + r * j->lda, j->lda, rows, kc, kce, NULL, 0, bp, state + (r - r0) * DG_HC_AMX_SF,
                                kc == k0, p == 0, nsc, NULL, NULL, 0);
            }
        }
        dg_hc_amx_finish(state, (int)(r1 - r0), nsc, j->d + sp * j->d_split + r0 * j->ldd + ns0, j->ldd,
                         p == 0 ? j->s + sp * j->s_split + r0 : NULL);
    }
}

/*
 * Rows [r0, r1) (at most HC_MB) of every split on the AMX path, for M > HC_MB: per panel, K in
 * chunks of j->kc (absolute, so each chunk's packed B serves every split in it), each chunk
 * over groups of DG_HC_AMX_ROWS rows, and each group through the pieces of the splits that
 * meet the chunk, in K order. A group's rows so stream from memory in address order, 8 KiB at
 * a time whatever the splits (a split's short range per row, and B's pieces of every split per
 * group, were measured 1.5-2x slower). At most one split is open across a chunk boundary, so a
 * row needs one state. The splits that end in a chunk go to a staging area (slot = split -
 * the chunk's first split), written to d and sqr_sum plane by plane after the chunk: scattered
 * writes of 16 rows per split between the tiles' loads cost M = 8192, K = 28672, 16 splits
 * ~10% more. Bits: those of amx_rows.
 */
static void amx_row_block(const hc_job *j, float *scratch, int64_t r0, int64_t r1) {
    float *state = scratch + j->bp_floats, *stage = state + j->state_floats_amx;
    float *stage_s = stage + j->slots * HC_MB * DG_HC_NS;
    uint8_t *flags = amx_flags(j, scratch);
    const int S = j->splits;
    int64_t cuts[HC_AMX_KC_WHOLE / DG_HC_BLOCK_K + 2];
    int cfg_rows = 0; /* the block configuration loaded (0: none) */
    for (int64_t p = 0; p < j->panels; ++p) {
        uint16_t *bp = amx_bp(scratch) + p * j->steps * DG_HC_AMX_STEP;
        const int64_t ns0 = p * DG_HC_NS, nsc = j->n - ns0 < DG_HC_NS ? j->n - ns0 : DG_HC_NS;
        int sp_first = 0; /* the split open at the chunk's start (splits tile [0, K) in order) */
        for (int64_t kc = 0; kc < j->k; kc += j->kc) {
            const int64_t kce = j->k - kc < j->kc ? j->k : kc + j->kc;
            if (!flags[p * j->steps + kc / 32]) {
                dg_hc_amx_pack_b(j->b + ns0 * j->ldb, j->ldb, nsc, j->k, kc / 32, dg_ceil_div(kce, 32), bp);
                flags[p * j->steps + kc / 32] = 1;
            }
            /* the chunk's pieces: splits sp_first .. sp_last, cut where each ends */
            int ncuts = 0, sp_last = sp_first;
            int64_t first_k0, k1;
            dg_hc_split_range(j->k, S, sp_first, &first_k0, &k1);
            for (;;) {
                if (k1 >= kce || sp_last + 1 >= S)
                    break;
                int64_t n0, n1;
                dg_hc_split_range(j->k, S, sp_last + 1, &n0, &n1);
                if (n0 == n1) /* splits past K */
                    break;
                cuts[ncuts++] = k1;
                ++sp_last;
                k1 = n1;
            }
            const bool last_done = k1 <= kce; /* else split sp_last goes on in the next chunk */
            for (int64_t r = r0; r < r1; r += DG_HC_AMX_ROWS) {
                const int rows = (int)(r1 - r < DG_HC_AMX_ROWS ? r1 - r : DG_HC_AMX_ROWS);
                float *st = state + (r - r0) * DG_HC_AMX_SF;
                if (rows != cfg_rows)
                    dg_hc_amx_config(cfg_rows = rows);
                dg_hc_amx_block(j->a + r * j->lda, j->lda, rows, kc, kce, cuts, ncuts, bp, st, first_k0 >= kc, p == 0,
                                nsc, stage + (r - r0) * DG_HC_NS, stage_s + (r - r0), HC_MB);
                if (last_done) {
                    const int64_t slot = (int64_t)ncuts * HC_MB + (r - r0);
                    dg_hc_amx_finish(st, rows, nsc, stage + slot * DG_HC_NS, DG_HC_NS, p == 0 ? stage_s + slot : NULL);
                }
            }
            const int sp_end = last_done ? sp_last + 1 : sp_last; /* splits [sp_first, sp_end) ended */
            for (int sp = sp_first; sp < sp_end; ++sp) {
                const int64_t slot = (int64_t)(sp - sp_first) * HC_MB;
                for (int64_t r = r0; r < r1; ++r)
                    memcpy(j->d + sp * j->d_split + r * j->ldd + ns0, stage + (slot + r - r0) * DG_HC_NS,
                           (size_t)nsc * sizeof(float));
                if (p == 0)
                    memcpy(j->s + sp * j->s_split + r0, stage_s + slot, (size_t)(r1 - r0) * sizeof(float));
            }
            sp_first = sp_end;
        }
        for (int sp = 0; sp < S; ++sp) { /* splits past K (more splits than K blocks) are zeros */
            int64_t k0, k1;
            dg_hc_split_range(j->k, S, sp, &k0, &k1);
            for (int64_t r = r0; k0 == k1 && r < r1; ++r) {
                memset(j->d + sp * j->d_split + r * j->ldd + ns0, 0, (size_t)nsc * sizeof(float));
                if (p == 0)
                    j->s[sp * j->s_split + r] = 0.0f;
            }
        }
    }
}

/*
 * Columns [c0, c1) of split sp, every row (at most HC_AMX_FEW_ROWS), on the transposed kernel:
 * a thread's share when threads share the columns (j->col_parts > 1). A column's sums depend
 * only on its row of B (each is its own row of the tile products), so the bits are amx_rows'.
 * Pieces never cross a panel; the square sums come with the piece holding column 0.
 */
static void amx_columns(const hc_job *j, float *scratch, int sp, int64_t c0, int64_t c1) {
    float *state = scratch + j->bp_floats;
    int64_t k0, k1;
    dg_hc_split_range(j->k, j->splits, sp, &k0, &k1);
    for (int64_t c = c0, next; c < c1; c = next) {
        next = (c / DG_HC_NS + 1) * DG_HC_NS < c1 ? (c / DG_HC_NS + 1) * DG_HC_NS : c1;
        for (int64_t r = 0; r < j->m; r += 16) {
            const int rows = (int)(j->m - r < 16 ? j->m - r : 16);
            dg_hc_amx_block_t(j->a + r * j->lda, j->lda, rows, k0, k1, j->b + c * j->ldb, j->ldb, next - c,
                              state + r * DG_HC_AMX_SF, c == 0);
        }
        dg_hc_amx_finish(state, (int)j->m, next - c, j->d + sp * j->d_split + c, j->ldd,
                         c == 0 ? j->s + sp * j->s_split : NULL);
    }
}

/*
 * The AMX path's work: units taken in order from a shared counter by whichever thread is free, so
 * a thread the OS delays holds up only its current unit (a row's bits never depend on the thread).
 * M > HC_MB: blocks of rows (at most HC_MB, about four per thread), every split; else
 * (split, part of the rows), with the rows cut into enough parts for every thread to get one.
 */
static void amx_run_units(const hc_job *j, float *scratch) {
    const int64_t S = j->splits, m = j->m;
    int64_t block = dg_align(dg_ceil_div(m, 4 * (int64_t)j->threads), DG_HC_AMX_ROWS);
    block = block < 2 * DG_HC_AMX_ROWS ? 2 * DG_HC_AMX_ROWS : block > HC_MB ? HC_MB : block;
    const int64_t parts = S >= j->threads ? 1 : dg_ceil_div(j->threads, S);
    const int64_t P = j->col_parts, units = P > 1 ? P * S : m > HC_MB ? dg_ceil_div(m, block) : parts * S;
    for (int64_t u; (u = __atomic_fetch_add(j->next_unit, 1, __ATOMIC_RELAXED)) < units;) {
        if (P > 1) {
            const int64_t p = u % P;
            amx_columns(j, scratch, (int)(u / P), j->n * p / P, j->n * (p + 1) / P);
        } else if (m > HC_MB) {
            const int64_t r0 = u * block;
            amx_row_block(j, scratch, r0, r0 + block < m ? r0 + block : m);
        } else {
            const int64_t r0 = m * (u % parts) / parts, r1 = m * (u % parts + 1) / parts;
            if (r0 < r1)
                amx_rows(j, scratch, (int)(u / parts), r0, r1);
        }
    }
}
#endif

/* Rows [r0, r1) of split sp (at most HC_MB rows), every column. */
static void run_rows(const hc_job *j, float *scratch, int sp, int64_t r0, int64_t r1) {
    for (int64_t ns0 = 0; ns0 < j->n; ns0 += DG_HC_NS)
        run_block_columns(j, scratch, sp, r0, r1, ns0, j->n - ns0 < DG_HC_NS ? j->n - ns0 : DG_HC_NS);
}

/*
 * Work items [i0, i1) of the (row, split) pairs, row-major (item = row * S + split): blocks of
 * up to HC_MB rows, and in each block the splits in order, so consecutive passes over a block
 * read neighbouring pieces of each row of A (as the chunks of an unsplit call do), which the
 * hardware prefetchers follow.
 */
static void run_items_row_major(const hc_job *j, float *scratch, int64_t i0, int64_t i1) {
    const int64_t S = j->splits;
    for (int64_t b0 = i0 / S; b0 * S < i1; b0 += HC_MB) {
        const int64_t b1 = b0 + HC_MB < j->m ? b0 + HC_MB : j->m;
        for (int sp = 0; sp < S; ++sp) {
            /* rows r of the block with r * S + sp in [i0, i1) */
            int64_t lo = i0 - sp > 0 ? dg_ceil_div(i0 - sp, S) : 0;
            int64_t hi = i1 - 1 - sp >= 0 ? (i1 - 1 - sp) / S + 1 : 0;
            lo = lo > b0 ? lo : b0;
            hi = hi < b1 ? hi : b1;
            if (lo < hi)
                run_rows(j, scratch, sp, lo, hi);
        }
    }
}

/*
 * Work items [i0, i1) of the (split, row) pairs, split-major (item = split * M + row), for M of
 * at most one block: a thread then takes whole splits, so it reads only its splits' part of B
 * (which, at M = 13, costs as much as A).
 */
static void run_items_split_major(const hc_job *j, float *scratch, int64_t i0, int64_t i1) {
    while (i0 < i1) {
        const int sp = (int)(i0 / j->m);
        const int64_t r0 = i0 % j->m, r1 = r0 + (i1 - i0) < j->m ? r0 + (i1 - i0) : j->m;
        run_rows(j, scratch, sp, r0, r1);
        i0 += r1 - r0;
    }
}

/*
 * Work items [i0, i1) of the (split, column part) pairs, every row: for few rows, where B (N x K
 * floats) outweighs A, threads that share the columns each read 1/col_parts of B from memory,
 * where sharing the rows would make each read all of it. Parts are whole column groups of the
 * micro kernel. An output's sums do not depend on the part that computes it.
 */
static void run_items_column_parts(const hc_job *j, float *scratch, int64_t i0, int64_t i1) {
    const int64_t P = j->col_parts, groups = dg_ceil_div(j->n, j->kern->cols);
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t p = i % P, g0 = groups * p / P, g1 = groups * (p + 1) / P;
        const int64_t ns0 = g0 * j->kern->cols, ns1 = g1 * j->kern->cols < j->n ? g1 * j->kern->cols : j->n;
        if (ns0 < ns1)
            run_block_columns(j, scratch, (int)(i / P), 0, j->m, ns0, ns1 - ns0);
    }
}

static void run_thread(const hc_job *j, int t, int nt) {
    const int64_t total = j->splits * (j->col_parts > 1 ? j->col_parts : j->m);
    float *scratch = j->scratch + (size_t)t * j->scratch_floats;
#if DG_HC_HAVE_AMX
    if (j->amx) {
        if (j->bp_floats) /* nothing packed yet */
            memset(amx_flags(j, scratch), 0, (size_t)(j->panels * j->steps));
        amx_run_units(j, scratch);
        return;
    }
#endif
    if (j->col_parts > 1)
        run_items_column_parts(j, scratch, total * t / nt, total * (t + 1) / nt);
    else if (j->m <= HC_MB)
        run_items_split_major(j, scratch, total * t / nt, total * (t + 1) / nt);
    else
        run_items_row_major(j, scratch, total * t / nt, total * (t + 1) / nt);
}

#ifndef _OPENMP
typedef struct hc_thread {
    const hc_job *job;
    int t;
} hc_thread;

static void *thread_main(void *arg) {
    const hc_thread *th = arg;
    run_thread(th->job, th->t, th->job->threads);
    return NULL;
}
#endif

/* Runs every thread's share; the partition depends on j->threads only. */
static void run_all(hc_job *j) {
    if (j->threads == 1) {
        run_thread(j, 0, 1);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(j->threads)
    run_thread(j, omp_get_thread_num(), omp_get_num_threads());
#else
    enum { MAX_THREADS = 256 };
    pthread_t tid[MAX_THREADS];
    hc_thread th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 1; t < j->threads; ++t) {
        th[t] = (hc_thread){j, t};
        started[t] = pthread_create(&tid[t], NULL, thread_main, &th[t]) == 0;
    }
    run_thread(j, 0, j->threads);
    for (int t = 1; t < j->threads; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else /* could not start: do its share here (same partition, same bits) */
            run_thread(j, t, j->threads);
    }
#endif
}

/*
 * Scratch memory. Small calls (M = 13 takes ~30 us) would spend a good part of their time in
 * mmap and page faults if each allocated its own, so one buffer of at most HC_CACHE_MAX bytes is
 * kept for the process and lent to one call at a time; a call that finds it lent allocates.
 */
#define HC_CACHE_MAX ((size_t)64 << 20)
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static float *g_cache;
static size_t g_cache_bytes;

static float *scratch_get(size_t bytes, bool *lent) {
    *lent = false;
    if (bytes <= HC_CACHE_MAX && pthread_mutex_trylock(&g_cache_lock) == 0) {
        if (g_cache_bytes < bytes) {
            dg_free(g_cache);
            g_cache = dg_malloc(bytes);
            g_cache_bytes = g_cache ? bytes : 0;
        }
        if (g_cache) {
            *lent = true;
            return g_cache;
        }
        pthread_mutex_unlock(&g_cache_lock);
    }
    return dg_malloc(bytes);
}

void dg_hc_release_scratch(void) {
    pthread_mutex_lock(&g_cache_lock);
    dg_free(g_cache);
    g_cache = NULL;
    g_cache_bytes = 0;
    pthread_mutex_unlock(&g_cache_lock);
}

static void scratch_put(float *p, bool lent) {
    if (lent)
        pthread_mutex_unlock(&g_cache_lock);
    else
        dg_free(p);
}

static int choose_threads(int64_t items, double flops) {
    int t = dg_num_threads();
    if (t > 256)
        t = 256;
    const double by_work = 1.0 + flops / HC_MIN_FLOPS_PER_THREAD;
    if (t > by_work)
        t = (int)by_work;
    if (t > items)
        t = (int)items;
    return t < 1 ? 1 : t;
}

dg_status dg_hc_prenorm_fast(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                             const dg_tensor *sqr_sum, int num_splits) {
    hc_job j = {
        .kern = dg_hc_kernel_for(dg_get_isa()),
        .a = a->data, .b = b->data, .d = d->data, .s = sqr_sum->data,
        .lda = a->strides[0], .ldb = b->strides[0], .ldd = d->strides[1], .d_split = d->strides[0],
        .s_split = sqr_sum->strides[0],
        .m = a->shape[0], .n = b->shape[0], .k = a->shape[1], .splits = num_splits,
    };
    const int64_t lanes = j.kern->lanes;
    j.state_floats = DG_HC_STATE(lanes);
#if DG_HC_HAVE_AMX
    if (dg_get_isa() >= DG_ISA_AMX && j.n <= HC_AMX_MAX_N)
        DG_PATH("amx kernel (B split into three BF16 parts) | first: m=%lld n=%lld k=%lld", (long long)j.m,
                (long long)j.n, (long long)j.k);
    else
#endif
        DG_PATH("%s kernel (%d float32 partial sums per output)%s | first: m=%lld n=%lld k=%lld", j.kern->name,
                j.kern->lanes, dg_get_isa() >= DG_ISA_AMX ? " [amx declined: N too wide]" : "", (long long)j.m,
                (long long)j.n, (long long)j.k);
    const int64_t block_rows = j.m < HC_MB ? j.m : HC_MB; /* a block never spans more than M rows */
#if DG_HC_HAVE_AMX
    /* Every AMX thread packs all of B it uses: wide B (not DeepSeek's) takes the FMA kernels. */
    j.amx = dg_get_isa() >= DG_ISA_AMX && j.n <= HC_AMX_MAX_N;
    /* multiples of 16 floats, so every thread's part is 64-byte aligned like the allocation */
    if (j.amx) {
        j.steps = dg_ceil_div(j.k, 32);
        j.kc = j.k <= HC_AMX_KC_WHOLE ? j.k : HC_AMX_KC;
        j.panels = dg_ceil_div(j.n, DG_HC_NS);
        /* no row range of at most HC_AMX_FEW_ROWS rows uses packed B */
        j.bp_floats = j.m > HC_AMX_FEW_ROWS ? (size_t)dg_align(j.panels * j.steps * (DG_HC_AMX_STEP * 2 + 1), 64) / 4 : 0;
        j.state_floats_amx = (size_t)dg_align(block_rows * DG_HC_AMX_SF, 16);
        j.scratch_floats = j.bp_floats + j.state_floats_amx;
        if (j.m > HC_MB) { /* amx_row_block's staging area */
            const int64_t most = j.kc / DG_HC_BLOCK_K + 2; /* a split has at least one K block */
            j.slots = j.splits < most ? j.splits : most;
            j.scratch_floats += (size_t)dg_align(j.slots * HC_MB * (DG_HC_NS + 1), 16);
        }
    } else
#endif
    {
        j.scratch_floats = (size_t)dg_align((DG_HC_NS + j.kern->rows) * j.kern->ld + block_rows * j.state_floats, 16);
    }
    /* Fewer splits than threads and B's bytes at least three times A's (4N >= 3 x 2M: N x K
     * floats against M x K BF16): the threads share one panel's columns (run_items_column_parts).
     * Below that the rows' shares win: every thread converting all of A costs more than the B
     * bytes it saves (measured on Zen 4, N = 24, K = 28672: 1.3x faster at M = 1 with B from
     * memory, even at M = 16, slower above; with B in L3 the same down to M = 8). */
    const int want = dg_num_threads();
    j.col_parts = 1;
    if (!j.amx && j.m <= HC_MB && j.n <= DG_HC_NS && 3 * j.m <= 2 * j.n && j.splits < want) {
        const int64_t groups = dg_ceil_div(j.n, j.kern->cols), parts = dg_ceil_div(want, j.splits);
        j.col_parts = (int)(parts < groups ? parts : groups);
    }
#if DG_HC_HAVE_AMX
    /* AMX at decode sizes: the same for the transposed kernel (amx_columns), whose tile products
     * cost so little that a thread's time is the bytes it reads: sharing the columns reads
     * 4NK / P + 2MK per thread against 4NK + 2MK / P, no more whenever M <= 2N, which holds at
     * M <= HC_AMX_FEW_ROWS for DeepSeek's N = 24 (measured on Sapphire Rapids, 2 threads,
     * N = 24, K = 28672: M = 1 mega_mhc 0.19 -> 0.12 ms, M = 13 0.17 -> 0.11 ms, M = 16
     * 0.33 -> 0.31 ms) */
    if (j.amx && j.m <= HC_AMX_FEW_ROWS && j.splits < want) {
        const int64_t parts = dg_ceil_div(want, j.splits);
        j.col_parts = (int)(parts < j.n ? parts : j.n);
    }
#endif
    /* Sharing columns splits B's bytes, which at decode sizes cost more than the FMAs: count
     * them as work too (HC_MIN_FLOPS_PER_THREAD per HC_B_BYTES_PER_FLOPS_UNIT bytes). */
    const double flops = 2.0 * (double)j.m * (double)j.n * (double)j.k;
    const double b_work = j.col_parts > 1 ? (double)j.n * (double)j.k * 4.0 / HC_B_BYTES_PER_FLOPS_UNIT * HC_MIN_FLOPS_PER_THREAD
                                          : 0.0;
    j.threads = choose_threads(j.splits * (j.col_parts > 1 ? j.col_parts : j.m), flops > b_work ? flops : b_work);
    int64_t next_unit = 0;
    j.next_unit = &next_unit;
    const size_t bytes = (size_t)j.threads * j.scratch_floats * sizeof(float);
    bool lent;
    j.scratch = scratch_get(bytes, &lent);
    if (!j.scratch)
        return dg_fail(DG_ERR_ALLOC, "cannot allocate %zu bytes of scratch memory", bytes);
    run_all(&j);
    scratch_put(j.scratch, lent);
    return DG_OK;
}

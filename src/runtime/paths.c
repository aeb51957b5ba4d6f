/*
 * paths.c - the path report: which implementation served each kind of call (DG_PRINT_PATHS).
 *
 * Call sites in the dispatch code (src/api, src/engine, src/kernels) describe the path they
 * take, and the faster one that declined with its reason, as one line. A line is recorded, and
 * with printing on written to stderr, the first time it occurs; the key is the line up to the
 * " | first: " example that follows it (the shape of the first call that took it), so a
 * decoder's thousands of calls print a handful of lines. Recording is off unless asked for:
 * then call sites cost one relaxed atomic load (DG_PATH in internal.h).
 */
#include "../core/internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_LINES 256 /* distinct lines kept; later ones are counted, not kept */
#define PATH_LINE_CAP 320
#define PATH_EXAMPLE " | first: "

static atomic_int g_mode = -1; /* -1: DG_PRINT_PATHS not read yet; 0 off; 1 print and record; 2 record */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_lines[PATH_LINES][PATH_LINE_CAP];
static int g_count;
static long g_dropped;

static int mode_from_env(void) {
    const char *s = getenv("DG_PRINT_PATHS");
    int m = 0;
    if (s && *s && strcmp(s, "0") != 0)
        m = strcmp(s, "2") == 0 ? 2 : 1;
    int expected = -1;
    atomic_compare_exchange_strong(&g_mode, &expected, m);
    return atomic_load(&g_mode);
}

int dg_paths_mode(void) {
    const int m = atomic_load_explicit(&g_mode, memory_order_relaxed);
    return m >= 0 ? m : mode_from_env();
}

void dg_set_print_paths(int mode) { atomic_store(&g_mode, mode == 1 || mode == 2 ? mode : 0); }

int dg_get_print_paths(void) { return dg_paths_mode(); }

static size_t key_length(const char *line) {
    const char *ex = strstr(line, PATH_EXAMPLE);
    return ex ? (size_t)(ex - line) : strlen(line);
}

void dg_path_note(const char *fmt, ...) {
    const int mode = dg_paths_mode();
    if (!mode)
        return;
    char line[PATH_LINE_CAP];
    int n = snprintf(line, sizeof line, "%s: ", dg_api_name());
    if (n < 0 || n >= (int)sizeof line)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    const size_t key = key_length(line);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_count; ++i)
        if (key_length(g_lines[i]) == key && memcmp(g_lines[i], line, key) == 0) {
            pthread_mutex_unlock(&g_mu);
            return;
        }
    if (g_count < PATH_LINES) {
        memcpy(g_lines[g_count++], line, sizeof line);
        if (mode == 1)
            fprintf(stderr, "[deepgemm path] %s\n", line);
    } else {
        ++g_dropped;
    }
    pthread_mutex_unlock(&g_mu);
}

void dg_path_reference(const char *declined_why) {
    if (dg_use_reference())
        dg_path_note("reference (the reference backend is selected)");
    else
        dg_path_note("reference [fast path declined: %s]", declined_why);
}

size_t dg_get_path_report(char *buf, size_t size) {
    pthread_mutex_lock(&g_mu);
    size_t need = 0;
    for (int i = 0; i <= g_count; ++i) {
        char extra[96];
        const char *s = g_lines[i];
        if (i == g_count) {
            if (!g_dropped)
                break;
            snprintf(extra, sizeof extra, "(%ld more distinct paths not kept)", g_dropped);
            s = extra;
        }
        const size_t len = strlen(s);
        if (buf && need + len + 1 < size) {
            memcpy(buf + need, s, len);
            buf[need + len] = '\n';
        }
        need += len + 1;
    }
    if (buf && size > 0)
        buf[need < size ? need : size - 1] = '\0';
    pthread_mutex_unlock(&g_mu);
    return need;
}

void dg_clear_path_report(void) {
    pthread_mutex_lock(&g_mu);
    g_count = 0;
    g_dropped = 0;
    pthread_mutex_unlock(&g_mu);
}

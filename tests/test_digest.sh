#!/usr/bin/env bash
# test_digest.sh DGBENCH DIGEST_DIR - reproducibility as a test (README, "Reproducibility").
#
# For every ISA level this CPU supports and DIGEST_DIR holds <level>.txt for, runs
# `DG_ISA=<level> dgbench --digest` with the default thread count, DG_NUM_THREADS=1 and =2, and
# compares each case's digest (a hash of its whole outputs from fixed-seed inputs) with the
# stored one: the library promises the same bits on every machine of one ISA level, whatever
# the thread count. Levels without a file are reported and skipped, levels the CPU lacks are
# skipped. Exit status: 0 when every compared run matched, 1 on a mismatch or failure, 77
# (ctest: skipped) when no level could be compared.
#
#   test_digest.sh DGBENCH DIGEST_DIR --write   regenerates DIGEST_DIR/<level>.txt for every
#                                               level this CPU supports (commit only levels
#                                               whose change is intended: see the README)
set -u
dgbench=$1
dir=$2
mode=${3:-check}
levels=(generic avx2 avx512 avx512_bf16 amx)

best=$(env -u DG_ISA "$dgbench" --info | sed -n 's/.*(best \([a-z0-9_]*\)).*/\1/p')
if [ -z "$best" ]; then
    echo "test_digest: cannot read the best ISA level from '$dgbench --info'"
    exit 1
fi
supported=()
for l in "${levels[@]}"; do
    supported+=("$l")
    [ "$l" = "$best" ] && break
done
arch=$(uname -m)
# Runs per level: the default thread count (logical cores available), then 1 and 2 unless the
# default is one of them.
default_threads=$(env -u DG_NUM_THREADS "$dgbench" --info | sed -n 's/.*| threads \([0-9]*\) |.*/\1/p')
thread_runs=(default)
for t in 1 2; do [ "$t" != "$default_threads" ] && thread_runs+=("$t"); done

if [ "$mode" = "--write" ]; then
    mkdir -p "$dir"
    for l in "${supported[@]}"; do
        env -u DG_BACKEND -u DG_NUM_THREADS DG_ISA="$l" "$dgbench" --digest --write "$dir" >/dev/null || exit 1
    done
    exit 0
fi

# The (case, isa, digest) lines of a digest listing, comments left out.
body() { grep -v '^#' | awk 'NF { print $1, $2, $3 }'; }

errf=$(mktemp "${TMPDIR:-/tmp}/dg-digest.XXXXXX")
trap 'rm -f "$errf"' EXIT
checked=0
failed=0
for l in "${levels[@]}"; do
    file=$dir/$l.txt
    is_supported=0
    for s in "${supported[@]}"; do [ "$s" = "$l" ] && is_supported=1; done
    if [ $is_supported = 0 ]; then
        echo "level $l: not supported by this CPU (best: $best), skipped"
        continue
    fi
    if [ ! -f "$file" ]; then
        echo "level $l: WARNING: no reference digests for level $l (generate with: DG_ISA=$l dgbench --digest --write $dir," \
             "on a machine whose digests for the other levels match, and commit $file); skipped"
        continue
    fi
    file_arch=$(sed -n 's/^#.*| arch \([^ |]*\).*/\1/p' "$file" | head -n 1)
    if [ "$file_arch" != "$arch" ]; then
        echo "level $l: $file holds digests of $file_arch builds, this is $arch; skipped"
        continue
    fi
    want=$(body <"$file")
    for t in "${thread_runs[@]}"; do
        if [ "$t" = default ]; then
            label="level $l, default threads ($default_threads)"
            got_all=$(env -u DG_BACKEND -u DG_NUM_THREADS DG_ISA="$l" "$dgbench" --digest 2>"$errf")
        else
            label="level $l, DG_NUM_THREADS=$t"
            got_all=$(env -u DG_BACKEND DG_ISA="$l" DG_NUM_THREADS="$t" "$dgbench" --digest 2>"$errf")
        fi
        rc=$?
        if [ $rc -ne 0 ]; then
            echo "$label: dgbench --digest failed (exit $rc):"
            { printf '%s\n' "$got_all" | grep FAILED; cat "$errf"; } | head -n 20
            failed=1
            continue
        fi
        got=$(printf '%s\n' "$got_all" | body)
        if [ "$got" = "$want" ]; then
            echo "$label: $(printf '%s\n' "$got" | wc -l) digests match $file"
        else
            echo "$label: DIGESTS DIFFER from $file (case, stored, this run):"
            join -j 1 -a 1 -a 2 -e MISSING -o 0,1.3,2.3 <(printf '%s\n' "$want" | sort) <(printf '%s\n' "$got" | sort) |
                awk '$2 != $3 { print "  " $0 }'
            failed=1
        fi
        checked=$((checked + 1))
    done
done

if [ $failed -ne 0 ]; then
    echo "test_digest: FAILED. Same inputs gave other bits than the stored digests. If the change of numerics"
    echo "is intended (a new kernel, another summation order), regenerate the files of every level it"
    echo "touches (tests/test_digest.sh DGBENCH tests/digests --write, or DG_ISA=<level> dgbench --digest"
    echo "--write tests/digests) and say so in the commit; otherwise it is a reproducibility bug."
    exit 1
fi
if [ $checked -eq 0 ]; then
    echo "test_digest: no level could be compared (skipped)"
    exit 77
fi
echo "test_digest: $checked run(s) matched"
exit 0

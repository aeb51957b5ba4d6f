#!/usr/bin/env bash
# test_install.sh - installs a built tree into a temporary prefix and builds a small program
# against it twice: with pkg-config (plain compiler calls) and with a CMake project using
# find_package(deepgemm); each way links the shared and the static library and runs the result.
# Also checks that the shared library exports only dg_* symbols.
#
# usage: test_install.sh BUILD_DIR CMAKE C_COMPILER
set -euo pipefail

build=$1
cmake_bin=$2
cc=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dg-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

step() { echo "== $*"; }
command -v pkg-config >/dev/null || { echo "pkg-config not found (apt-get install pkg-config)"; exit 1; }

step "cmake --install into $prefix"
"$cmake_bin" --install "$build" --prefix "$prefix" >"$tmp/install.log"
pc=$(find "$prefix" -name deepgemm.pc | head -n1)
[ -n "$pc" ] || { echo "deepgemm.pc not installed"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
for f in "$prefix/include/deepgemm.h" "$libdir/libdeepgemm.a" "$libdir/libdeepgemm.so" \
         "$libdir/cmake/deepgemm/deepgemmConfig.cmake"; do
    [ -e "$f" ] || { echo "missing after install: $f"; exit 1; }
done

step "exported symbols"
if command -v nm >/dev/null; then
    bad=$(nm -D --defined-only "$libdir/libdeepgemm.so" | awk '{print $NF}' |
          grep -v -E '^(dg_|_init$|_fini$|_edata$|_end$|__bss_start$)' || true)
    [ -z "$bad" ] || { echo "non-dg_ symbols exported:"; echo "$bad"; exit 1; }
fi

step "pkg-config: shared and static"
export PKG_CONFIG_PATH=$(dirname "$pc")
cflags=$(pkg-config --cflags deepgemm)
libs=$(pkg-config --libs deepgemm)
libs_static=$(pkg-config --static --libs deepgemm)
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$here/consumer.c" -o "$tmp/pc_shared" $libs
# -Bstatic makes the linker take libdeepgemm.a although libdeepgemm.so sits beside it.
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$here/consumer.c" -o "$tmp/pc_static" \
    ${libs_static/-ldeepgemm/-Wl,-Bstatic -ldeepgemm -Wl,-Bdynamic}
LD_LIBRARY_PATH=$libdir "$tmp/pc_shared"
"$tmp/pc_static"
if command -v readelf >/dev/null; then
    readelf -d "$tmp/pc_shared" | grep -q 'libdeepgemm\.so' || { echo "pc_shared does not use the .so"; exit 1; }
    if readelf -d "$tmp/pc_static" | grep -q 'libdeepgemm\.so'; then
        echo "pc_static depends on the .so"; exit 1
    fi
fi

step "find_package(deepgemm): shared and static"
"$cmake_bin" -S "$here" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" ||
    { cat "$tmp/configure.log"; exit 1; }
"$cmake_bin" --build "$tmp/consumer" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
LD_LIBRARY_PATH=$libdir "$tmp/consumer/consumer_shared"
"$tmp/consumer/consumer_static"

step "install test passed"

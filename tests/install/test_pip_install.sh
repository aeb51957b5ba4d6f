#!/usr/bin/env bash
# test_pip_install.sh SOURCE_DIR PYTHON - `pip install .` of the Python module deep_gemm_cpu into a
# temporary directory (pip --target, no network: scikit-build-core must be installed, as .ci/run
# does), then import it from there and run one GEMM on NumPy arrays.
set -euo pipefail
src=$1
py=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$py" -c "import scikit_build_core" 2>/dev/null; then
    echo "test_pip_install: scikit-build-core is not installed (pip install scikit-build-core)" >&2
    exit 1
fi
"$py" -m pip install --quiet --no-build-isolation --no-deps --target "$tmp/site" "$src"

cd "$tmp"
PYTHONPATH="$tmp/site" "$py" - "$tmp/site" <<'PYEOF'
import os, sys
import numpy as np
import deep_gemm_cpu as dg
assert os.path.dirname(os.path.dirname(os.path.abspath(dg.__file__))) == os.path.abspath(sys.argv[1]), dg.__file__
a = np.arange(12, dtype=np.float32).reshape(3, 4)
q, sf = dg.per_token_cast_to_fp8(a, use_ue8m0=False)
assert q.shape == (3, 4) and sf.shape == (3, 1), (q.shape, sf.shape)
assert dg.calc_diff(a, a) == 0.0
print('pip install OK:', dg.__file__)
PYEOF

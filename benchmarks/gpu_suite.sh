#!/usr/bin/env bash
# The GPU suite: every gpu-marked test, then the GPU benchmarks (benchmarks/gpu_suite.py); JSON lines on
# stdout, one per item, the tests' log on stderr. On a GPU machine without CuPy or cuDF it first installs
# the `gpu` extra, so that the CuPy feature engineering and the cuDF input adapter are tested
# (SESSREC_NO_INSTALL=1 skips that, for machines without a package index); on a machine without CUDA
# every item is reported as skipped.
#   bash benchmarks/gpu_suite.sh [gpu_suite.py options, e.g. --repeats 10]
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
missing() {
    "$python" -c "import importlib.util as u; print(' '.join(n for n in ('cupy', 'cudf') if u.find_spec(n) is None))"
}
if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    absent=$(missing)
    if [ -n "$absent" ] && [ -z "${SESSREC_NO_INSTALL:-}" ]; then
        "$python" -m pip install -q -e '.[gpu]' >&2 || true
        absent=$(missing)
    fi
    if [ -n "$absent" ]; then
        echo "{\"suite\": \"gpu\", \"item\": \"gpu_extra\", \"status\": \"incomplete\", \"missing\": \"$absent\"}"
    fi
    log=$(mktemp)
    if "$python" -m pytest -m gpu -q -p no:cacheprovider -rs >"$log" 2>&1; then status=ok; else status=failed; fi
    summary=$(tail -n 1 "$log" | tr -d '"=')
    echo "{\"suite\": \"gpu\", \"item\": \"gpu_tests\", \"status\": \"$status\", \"pytest\": \"$summary\"}"
    cat "$log" >&2
    rm -f "$log"
else
    echo '{"suite": "gpu", "item": "gpu_tests", "status": "skipped", "reason": "no CUDA device (torch.cuda.is_available() is False)"}'
fi
"$python" benchmarks/gpu_suite.py "$@"

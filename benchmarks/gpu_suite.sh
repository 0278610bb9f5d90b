#!/usr/bin/env bash
# The GPU suite: every gpu-marked test, then the GPU benchmarks (benchmarks/gpu_suite.py); JSON lines on
# stdout, one per item. On a GPU machine it first installs the `gpu` extra (CuPy, cuDF) so that the
# CuPy feature engineering and the cuDF input adapter are tested; on a machine without CUDA every item
# is reported as skipped.
#   bash benchmarks/gpu_suite.sh [gpu_suite.py options, e.g. --repeats 10]
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$python" -m pip install -q -e '.[gpu]' >&2 || echo '{"suite": "gpu", "item": "gpu_extra", "status": "failed", "error": "pip install -e .[gpu] failed"}'
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

#!/usr/bin/env bash
# GPU evidence in one command (benchmarks/gpu/run_all.py): every section on one GPU, one JSON file rewritten after
# every section (default $OUT/gpu_evidence.json, else out/gpu_evidence.json in the checkout), a table at the end.
#   benchmarks/gpu/run_all.sh [--out FILE] [--sections NAME ...] [--time-limit S] [--dry-run | --cpu] [--help]
# Where diffusers or pydantic cannot be imported (the lent GPU image has neither, and no network), the wheels of
# the carried folder (.whl, made by benchmarks/gpu/wheels.sh; ACCELPATCH_WHEELS names another) are installed with
# --no-index into a target folder (ACCELPATCH_SITE, default $TMPDIR/accelpatch-site) put on PYTHONPATH first.
# Exit codes: 0 ok, 1 a lossless bit-identity check failed, 2 usage, no CUDA or nothing to install from,
# 3 a section errored (on --dry-run: a build failed or the plan does not fit), 4 required lossless models unchecked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ -n "${ACCELPATCH_PYTHON:-}" ]]; then
    PYTHON="$ACCELPATCH_PYTHON"
elif [[ -x .venv/bin/python ]]; then
    PYTHON=.venv/bin/python
else
    PYTHON=python3
fi
WHEELS="${ACCELPATCH_WHEELS:-.whl}"
if ! "$PYTHON" -c "import diffusers, pydantic" 2>/dev/null; then
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    if (( ${#wheels[@]} == 0 )); then
        echo "run_all.sh: diffusers/pydantic do not import and $WHEELS holds no wheels (make them with" \
             "benchmarks/gpu/wheels.sh and carry that folder)" >&2
        exit 2
    fi
    SITE="${ACCELPATCH_SITE:-${TMPDIR:-/tmp}/accelpatch-site}"
    echo "run_all.sh: installing ${#wheels[@]} wheels from $WHEELS into $SITE (no network)"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}"
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    "$PYTHON" -c "import accelpatch, diffusers, pydantic; print('run_all.sh: diffusers', diffusers.__version__, \
'pydantic', pydantic.__version__, 'accelpatch from', accelpatch.__file__)"
fi
exec "$PYTHON" benchmarks/gpu/run_all.py "$@"

#!/usr/bin/env bash
# GPU evidence in one command (benchmarks/gpu/run_all.py): every section on one GPU, one JSON file
# (default gpu_evidence.json at the repository root; a relative --out is relative to the root too), a table.
#   benchmarks/gpu/run_all.sh [--out FILE] [--sections NAME ...] [--dry-run] [--help]
# Exit codes: 0 ok, 1 a lossless bit-identity check failed, 2 usage or no CUDA, 3 a section errored.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ -x .venv/bin/python ]]; then
    PYTHON=.venv/bin/python
else
    PYTHON=python3
fi
exec "$PYTHON" benchmarks/gpu/run_all.py "$@"

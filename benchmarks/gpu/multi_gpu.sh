#!/usr/bin/env bash
# Several GPUs on one machine (NCCL): benchmarks/gpu/multi_gpu.py on every GPU torch sees.
#   benchmarks/gpu/multi_gpu.sh [--modes ...] [--rounds N] [--out FILE]    (--dry-run: CPU, gloo, 2 processes)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
PYTHON=python3
[[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
if [[ " $* " == *" --dry-run "* ]]; then
    GPUS=2
else
    GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
    if (( GPUS < 2 )); then
        echo "multi_gpu.sh needs at least 2 GPUs; torch sees $GPUS" >&2
        exit 2
    fi
fi
exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$GPUS" benchmarks/gpu/multi_gpu.py "$@"

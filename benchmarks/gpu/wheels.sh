#!/usr/bin/env bash
# The carried wheel folder for the lent GPU machine: the packages its image lacks (diffusers, pydantic and what
# pydantic needs, typing-extensions >= 4.16), as binary wheels for its Python (3.12, manylinux x86_64), so that
# run_all.sh can install them there with no network. Run here (needs PyPI); prints the sizes and fails when the
# working tree plus the wheels pass the 64 MiB that may travel.
#   benchmarks/gpu/wheels.sh [DIR]        # default .whl (ignored by git), carried with: carry [".whl"]
# PYTHON_VERSION=3.11 benchmarks/gpu/wheels.sh /tmp/whl   # the same set for another Python (the CPU rehearsal)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DIR="${1:-.whl}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
LIMIT_MIB=64
PIP_PYTHON="${PIP_PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
PACKAGES=(diffusers==0.42.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
          typing-inspection==0.4.5 typing-extensions==4.16.0)

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
"$PIP_PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" "${PACKAGES[@]}"

count=$(ls "$DIR"/*.whl | wc -l)
if [[ "$count" -ne "${#PACKAGES[@]}" ]]; then
    echo "wheels.sh: expected ${#PACKAGES[@]} wheels in $DIR, found $count" >&2
    exit 1
fi
ls -l "$DIR"/*.whl | awk '{printf "%8.2f MiB  %s\n", $5 / 1048576, $NF}'
wheels=$(cat "$DIR"/*.whl | wc -c)
# what travels: the files git would send (tracked, and untracked but not ignored) plus the wheel folder
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
total=$((wheels + tree))
awk -v w="$wheels" -v t="$tree" -v s="$total" -v l="$LIMIT_MIB" 'BEGIN {
    printf "wheels %.2f MiB + working tree %.2f MiB = %.2f MiB of %d MiB\n", w / 1048576, t / 1048576, s / 1048576, l }'
if (( total > LIMIT_MIB * 1048576 )); then
    echo "wheels.sh: the tree and the wheels pass ${LIMIT_MIB} MiB: they cannot travel to the GPU machine" >&2
    exit 1
fi

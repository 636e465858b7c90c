#!/usr/bin/env bash
# CPU rehearsal of the GPU day: run_all.sh in an environment shaped like the lent GPU image, as far as this machine
# allows. A Python that has torch but neither diffusers nor pydantic (a copy of PYTHON's site-packages without
# them, no .pth files: accelpatch comes from this checkout only), the six wheels made by wheels.sh for that
# Python's version (the image's are for 3.12), installed by run_all.sh with --no-index into a target folder.
#   benchmarks/gpu/rehearse.sh [run_all.sh arguments]     # default: --dry-run
#   PYTHON=/work/venv-t211/bin/python benchmarks/gpu/rehearse.sh --dry-run   # another torch (e.g. 2.11)
# Needs PyPI once for the wheels (kept in out/rehearsal-wheels-<version>).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
site_packages=$("$PYTHON" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
wheels="out/rehearsal-wheels-$version"
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    PIP_PYTHON="$PYTHON" PYTHON_VERSION="$version" benchmarks/gpu/wheels.sh "$wheels"
fi
shaped=$(mktemp -d "${TMPDIR:-/tmp}/accelpatch-shaped.XXXXXX")
trap 'rm -rf "$shaped"' EXIT
mkdir "$shaped/site"
for entry in "$site_packages"/*; do
    name=$(basename "$entry")
    case "$name" in
        diffusers*|pydantic*|annotated_types*|typing_inspection*|typing_extensions*|accelpatch*|*.pth|__pycache__)
            continue ;;
    esac
    ln -s "$entry" "$shaped/site/$name"
done
# the image's python: no site (so no .pth and none of this venv's diffusers), its packages on PYTHONPATH
printf '#!/bin/sh\nexec "%s" -S "$@"\n' "$PYTHON" > "$shaped/python"
chmod +x "$shaped/python"
if "$shaped/python" -c "import diffusers" 2>/dev/null || "$shaped/python" -c "import pydantic" 2>/dev/null; then
    echo "rehearse.sh: the shaped environment still imports diffusers or pydantic" >&2
    exit 1
fi
echo "rehearse.sh: Python $version, torch from $site_packages, no diffusers/pydantic, wheels from $wheels"
PYTHONPATH="$shaped/site" ACCELPATCH_PYTHON="$shaped/python" ACCELPATCH_WHEELS="$wheels" \
    ACCELPATCH_SITE="$shaped/target" benchmarks/gpu/run_all.sh "${@:---dry-run}"

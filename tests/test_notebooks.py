"""The notebooks in notebooks/ run top to bottom, offline, and show what they claim, so they cannot rot.

Each notebook is executed with nbclient in a fresh kernel started from *this* interpreter (``sys.executable``)
through a kernelspec written to a temporary folder, so the test works in a fresh virtual environment where no
Jupyter kernel is registered and never picks up another Python's ``python3`` kernel. The kernel runs in the
repository root with ``OMP_NUM_THREADS=1``. Besides "no cell raised", each notebook's printed output is checked
for the facts it exists to show.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

try:
    import ipykernel  # noqa: F401  (the kernel runs it)
    import matplotlib  # noqa: F401  (the notebooks plot)
    import nbformat
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    MISSING = None
except ImportError as error:
    MISSING = (f"the notebook tests need nbclient, nbformat, ipykernel and matplotlib ({error}); install the dev "
               "extras: pip install -e .[dev]")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
EXPECTED = ("01_quickstart.ipynb", "02_quality_vs_speed.ipynb", "03_sol_attn_tuning.ipynb")
KERNEL_NAME = "accelpatch-notebook-test"
#: seconds per cell; each notebook runs in well under a minute on 2 CPU cores
CELL_TIMEOUT = 180
CUDA = False
try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="module", autouse=True)
def _requirements():
    """Fail (not skip: a skipped notebook test is a notebook that can rot) when the notebook tooling is missing,
    without stopping the collection of the rest of the suite."""
    if MISSING:
        pytest.fail(MISSING, pytrace=False)


def test_expected_notebooks_exist():
    """A deleted or renamed notebook fails here (the parametrised test below only sees the files that exist)."""
    missing = [name for name in EXPECTED if not (NOTEBOOKS / name).is_file()]
    assert not missing, f"missing notebooks: {missing}"


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, f"{name}: clear the outputs of cells {dirty} before committing"


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory) -> "KernelSpecManager":
    """A kernelspec running ipykernel in this interpreter, in a folder of its own."""
    root = tmp_path_factory.mktemp("kernels")
    (root / KERNEL_NAME).mkdir()
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "accelpatch notebook test", "language": "python",
            "env": {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1"),
                    "PYDEVD_DISABLE_FILE_VALIDATION": "1"}}
    (root / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(root)])


def _text(nb) -> str:
    """Everything the code cells printed or displayed as plain text (stdout, text/plain). A cell's consecutive
    stdout outputs run on as the notebook shows them: the kernel flushes stdout on a timer, so on a busy machine one
    ``print`` can arrive as two stream outputs (seen in CI: "current_quality(h3) =" and " high")."""
    parts: list[str] = []
    for cell in nb.cells:
        previous_was_stream = False
        for output in cell.get("outputs", []):
            if output.output_type == "stream" and output.name != "stdout":
                continue  # stderr (warnings) may arrive between two pieces of one print
            is_stream = output.output_type == "stream"
            if is_stream and previous_was_stream:
                parts[-1] += output.text
            elif is_stream:
                parts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                parts.append(str(output.data.get("text/plain", "")))
            previous_was_stream = is_stream
    return "\n".join(parts)


def _images(nb) -> int:
    return sum("image/png" in output.get("data", {}) for cell in nb.cells for output in cell.get("outputs", []))


def _check_quickstart(text: str, images: int) -> None:
    for claim in ("default (lossless) vs unpatched, bit-identical: True",
                  "quality('exact')   vs unpatched, bit-identical: True",
                  "strict, quality('lossless') vs unpatched, bit-identical: True",
                  "after remove() vs unpatched, bit-identical: True",
                  "H3 after remove() vs unpatched, bit-identical: True",
                  "quality('lossless') vs unpatched, bit-identical: True",
                  "outside any block:      current_quality(pipe) = lossless",
                  "inside quality('high'): current_quality(pipe) = high",
                  "current_quality(h3) = high",
                  "Sol-Attn calls under quality('lossless'): 0"):
        assert claim in text, (f"quickstart does not show {claim!r}; its lines naming "
                               f"{claim.split()[0]!r}: {[line for line in text.splitlines() if claim.split()[0] in line]}")
    assert "accelpatch: nothing is patched" in text
    if not CUDA:  # the never-silent contract on a CPU-only torch
        assert "CUDA is unavailable" in text
        assert "strict, quality('high') raised FastPathUnavailableError" in text
        assert "fast calls of the high path: 0 |" in text  # the approximate path fell back, visibly
        assert "assert_fast_path_ran: a fast path ran" in text  # the lossless fused kernels did run
    # the H3 video layers ran sparse and report their exact fraction
    sparse_sites = re.findall(r"transformer_blocks\.\d\.attn\s+sol_attn\s+fast calls (\d+)\s+exact fraction ([\d.]+)",
                              text)
    assert len(sparse_sites) == 2, text
    assert all(int(calls) > 0 and 0.0 < float(fraction) <= 1.0 for calls, fraction in sparse_sites)
    # the trained tiny models' tiers, side by side (#43): lossless bit-identical, each strip shown inline
    from accelpatch.tiny_models.shipped import shipped_families

    shipped = len(shipped_families())
    assert shipped == 3 and text.count("lossless: bit-identical; motion ratio 1.000") == shipped
    assert text.count("strip (one row per tier):") == shipped
    assert all(f"trained tiny {name} under" in text for name in ("Wan 2.x", "SANA-Video", "SANA-Video 2.0"))
    assert images >= shipped, "the trained models' strips (PNG) are not shown inline"


def _check_quality_vs_speed(text: str, images: int) -> None:
    assert text.count("accelpatch validate:") == 2 and text.count("accelpatch bench:") == 2
    assert "passed: True" in text
    assert "with require_fast_path, passed: " in text
    if not CUDA:  # the high candidate could not run its fast path, and says so
        assert "with require_fast_path, passed: False" in text
        assert "no fast path ran" in text
    assert "distinguishable from noise:" in text
    assert "sol_attn x" in text  # the H3 candidates took their fast path
    assert images >= 4, f"expected two per-frame plots and two worst-frame strips inline, got {images} images"


def _check_tuning(text: str, images: int) -> None:
    rows = re.findall(r"^tau\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+|inf) dB$", text, re.MULTILINE)
    assert [float(r[0]) for r in rows] == [0, 0.25, 0.5, 1, 1.5, 2, 3], text
    fractions = [float(r[1]) for r in rows]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > fractions[-1], fractions
    assert all(0 < f <= 1 for f in fractions)
    assert images >= 1, "the tau chart is not shown inline"
    assert len(re.findall(r"^tau=[\d.]+: PASS, fast calls [1-9]", text, re.MULTILINE)) == 3, text


CHECKS = {"01_quickstart.ipynb": _check_quickstart, "02_quality_vs_speed.ipynb": _check_quality_vs_speed,
          "03_sol_attn_tuning.ipynb": _check_tuning}


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs(name, kernel_specs):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_specs)
    # iopub_timeout: nbclient waits only 4 s (default) for a cell's last outputs after its reply and then drops them
    # silently; on a loaded 2-core machine a print went missing that way. Wait longer, and raise if one still does.
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=120, iopub_timeout=60,
                            raise_on_iopub_timeout=True,
                            resources={"metadata": {"path": str(REPO)}})
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as error:  # the message holds the failing cell and its traceback
        pytest.fail(f"{name}: a cell raised:\n{error}", pytrace=False)
    elapsed = time.perf_counter() - start
    print(f"{name}: executed in {elapsed:.1f} s")
    errors = [output for cell in nb.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors, f"{name}: {errors}"
    # each figure is shown once (a pyplot figure was also shown again by the inline backend), and progress bars
    # render (without ipywidgets tqdm.auto prints "IProgress not found")
    for index, cell in enumerate(nb.cells):
        images = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        assert len(images) == len(set(images)), f"{name}: cell {index} shows the same image {len(images)} times"
    stderr = "".join(o.text for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert "IProgress not found" not in stderr, f"{name}: {stderr[:500]}"
    check = CHECKS.get(name)
    if check is not None:
        check(_text(nb), _images(nb))


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_says_how_to_run_it_at_the_top(name):
    """Stored without outputs, so the first cell must say how to run it (and the README, where it lists them)."""
    first = nbformat.read(NOTEBOOKS / name, as_version=4).cells[0]
    assert first.cell_type == "markdown"
    for needed in ("**Run it**", 'pip install -e ".[notebooks]" jupyterlab', "jupyter lab notebooks/",
                   "make test PYTEST_ARGS=tests/test_notebooks.py"):
        assert needed in first.source, f"{name}: the first cell does not say {needed!r}"
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| learn by running |"))
    assert "jupyter lab notebooks/" in row and 'pip install -e ".[notebooks]" jupyterlab' in row

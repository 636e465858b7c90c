"""Test-process set-up: the Triton interpreter must be chosen before any kernel module is imported,
and tiny models run fastest and least noisily on one thread."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# The tiny models' calls are all below the lossless paths' size floor (accelpatch.core.sites.MIN_ELEMENTS), where
# fusing does not pay: the suite fuses every call, so that tiny models exercise the fused paths
# (tests/test_lossless_fusions.py tests the floor itself).
os.environ.setdefault("ACCELPATCH_FUSE_MIN_ELEMENTS", "0")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402

#: a crash or a hang in one test never stalls the run (tests/_suite_guard.py); the files go to xdist's workers
#: longest first (tests/_suite_order.py)
pytest_plugins = ("_suite_guard", "_suite_order")


@pytest.fixture(autouse=True)
def _warnings_as_in_a_fresh_process():
    """accelpatch says each (fast-path kind, reason) once per process: each test hears them as a new process would."""
    from accelpatch.core import patcher

    patcher.forget_warnings()
    yield



_interpreter_checked = False


def pytest_runtest_setup(item):
    """Before the first test of a process that has imported Triton: make sure its interpreter runs kernels whose loop
    bounds are runtime scalars (tests/_triton_interpreter.py says why triton 3.6 with NumPy >= 2.4 does not)."""
    global _interpreter_checked
    import sys

    if _interpreter_checked or "triton" not in sys.modules:
        return
    _interpreter_checked = True
    from _triton_interpreter import fix_scalar_loop_bounds

    fix_scalar_loop_bounds()

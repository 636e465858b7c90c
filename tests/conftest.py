"""Test-process set-up: the Triton interpreter must be chosen before any kernel module is imported,
and tiny models run fastest and least noisily on one thread."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _warnings_as_in_a_fresh_process():
    """accelpatch says each (fast-path kind, reason) once per process: each test hears them as a new process would."""
    from accelpatch import patcher

    patcher.forget_warnings()
    yield


"""Test-process set-up: the Triton interpreter must be chosen before any kernel module is imported,
and tiny models run fastest and least noisily on one thread."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


#: files that count process-global Dynamo graphs: they run first in their process (first in their pytest-xdist
#: worker under ``--dist loadfile``). Their fixtures reset Dynamo, yet in 2 of 3 two-worker runs one of them saw 8
#: graphs where it compiles 6 alone, after some other files in the same worker: a leak of process state we have
#: not found (never seen single-process, nor when the file runs first).
FIRST_IN_PROCESS = ("test_compile.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in FIRST_IN_PROCESS)  # stable: the rest keep their order

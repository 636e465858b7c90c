"""Test-process set-up: the Triton interpreter must be chosen before any kernel module is imported,
and tiny models run fastest and least noisily on one thread."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


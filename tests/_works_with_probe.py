"""Runs works-with combinations without accelpatch, one after another (``_works_with_tools.probe_unpatched`` starts
it): reads one probe key per line on stdin and prints ``start N`` before the N-th and ``ok``, ``skipped <json>``, ``raised <json>`` or ``ours <json>`` (raised
in accelpatch's code) after
it, so that when a tool crashes the process, the parent knows which combination it was."""
import json
import sys
import traceback
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

import _works_with_tools as W  # noqa: E402
import accelpatch  # noqa: E402

OURS = Path(accelpatch.__file__).resolve().parent

for index, key in enumerate(line for line in sys.stdin.read().splitlines() if line):
    print("start", index, flush=True)
    try:
        W.run_unpatched(key)
    except pytest.skip.Exception as skipped:  # the tool is not installed (W.need)
        print("skipped", json.dumps(str(skipped.msg)), flush=True)
    except BaseException as error:  # noqa: BLE001  (an import error, the tool's own error: all are answers)
        where = traceback.extract_tb(error.__traceback__)[-1].filename
        text = json.dumps(f"{type(error).__name__}: {error} ({where.split('site-packages/')[-1]})"[:500])
        # raised in accelpatch's own code (SANA-Video 2.0's modeling is ours): not the tool's, so not a skip
        print("ours" if Path(where).resolve().is_relative_to(OURS) else "raised", text, flush=True)
    else:
        print("ok", flush=True)

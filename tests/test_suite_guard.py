"""The suite always ends with a summary (tests/_suite_guard.py): throwaway test files that segfault, hang in Python
and deadlock in native code, run in a subprocess through the README's test command's own pytest configuration
(setup.cfg, tests/conftest.py, the Makefile's PYTEST_ARGS), end in a bounded time with each one reported once,
named, and every other test run."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from _cpu_kind import describe as describe_cpu
from _suite_guard import death_cause, where_it_was

REPO = Path(__file__).resolve().parents[1]

PRELUDE = "import accelpatch.core.patcher  # what the conftest fixture imports: at collection, outside the limits\n"
THROWAWAY = {
    "crash": """import os, signal, time
def test_before(): time.sleep(0.5)
def test_crash(): os.kill(os.getpid(), signal.SIGSEGV)
def test_after_the_crash(): pass
""",
    "hang": """import time, pytest
@pytest.mark.timeout(3)
def test_sleeps_forever(): time.sleep(10**6)
def test_after_the_hang(): pass
""",
    "native": """import ctypes, pytest
@pytest.mark.timeout(2)
def test_native_deadlock():
    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL: pytest-timeout's signal can never run its handler
    mutex = ctypes.create_string_buffer(64)  # zeroed: a default pthread mutex, locked twice by one thread
    libc.pthread_mutex_lock(mutex); libc.pthread_mutex_lock(mutex)
def test_after_the_deadlock(): pass
""",
    "plain": """def test_one(): pass
def test_two(): pass
""",
}


def readme_pytest_args() -> list[str]:
    """The Makefile's default PYTEST_ARGS (what `make test` runs), without its test paths."""
    text = (REPO / "Makefile").read_text()
    args = shlex.split(re.search(r"^PYTEST_ARGS \?= (.*)$", text, re.M).group(1))
    return [a for a in args if a != "tests"]


@pytest.mark.timeout(420)
def test_crashes_and_hangs_end_with_a_summary():
    tag = f"_throwaway_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    files = []
    try:
        for name, body in THROWAWAY.items():
            path = REPO / "tests" / f"{tag}_{name}.py"  # not test_*.py: collected only when named
            path.write_text(PRELUDE + body)
            files.append(path)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        env.update(OMP_NUM_THREADS="1", TRITON_INTERPRET="1")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", *readme_pytest_args(), "-p", "no:cacheprovider",
             "-o", "hard_timeout_grace=3", *(str(f.relative_to(REPO)) for f in files)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=360)
    finally:
        for path in files:
            path.unlink(missing_ok=True)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert done.stdout.splitlines()[0] == f"CPU: {describe_cpu()}", done.stdout[:500]
    assert re.search(r"^3 failed, 6 passed\b", done.stdout.splitlines()[-1]), out[-4000:]
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.M)
    assert sorted(f.split("::")[1] for f in failed) == ["test_crash", "test_native_deadlock", "test_sleeps_forever"]
    assert "killed by SIGSEGV (Segmentation fault)" in out and "in test_crash" in out
    assert "the hard time limit (0:00:05) ended it" in out and "in test_native_deadlock" in out
    assert "Timeout (>3.0s) from pytest-timeout" in out
    assert "INTERNALERROR" not in out


def test_death_causes_are_named():
    segv = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n  File \"t.py\""
    assert death_cause(segv, -11) == "killed by SIGSEGV (Segmentation fault)"
    assert death_cause("Fatal Python error: Illegal instruction\n", None) == "killed by SIGILL (Illegal instruction)"
    assert death_cause("Timeout (0:06:00)!\nThread 0x1 (most recent call first):\n", 1).startswith(
        "the hard time limit (0:06:00) ended it")
    assert death_cause("", -9) == "killed by SIGKILL"
    assert "status 1" in death_cause("", 1)
    assert death_cause("", None) == "the worker died (no fault report, exit status unknown)"


def test_where_it_was_shows_the_faulting_thread_first_and_drops_the_module_list():
    report = ("Fatal Python error: Aborted\n\nThread 0x2 (most recent call first):\n  File \"execnet/x.py\", line 1\n"
              "\nCurrent thread 0x1 (most recent call first):\n  File \"throwaway.py\", line 3 in test_x\n\n"
              "Extension modules: numpy, torch._C (total: 2)\n")
    assert where_it_was(report) == ["Fatal Python error: Aborted", "Current thread 0x1 (most recent call first):",
                                    '  File "throwaway.py", line 3 in test_x']
    timeout = "Timeout (0:00:05)!\nThread 0x2 (most recent call first):\n  File \"x/execnet/gateway_base.py\"\n" \
              "Thread 0x1 (most recent call first):\n  File \"throwaway.py\", line 7 in test_y\n"
    assert where_it_was(timeout) == ["Timeout (0:00:05)!", "Thread 0x1 (most recent call first):",
                                     '  File "throwaway.py", line 7 in test_y']


def test_files_go_to_the_workers_longest_first_each_files_order_kept():
    """tests/_suite_order.py: stored seconds order the files, longest first; a file with none is placed by its tests
    (0.3 s each); a file's tests stay together and in their order."""
    from _suite_order import longest_first

    nodeids = ["t/a.py::t1", "t/a.py::t2", "t/b.py::t1", "t/c.py::t1", "t/c.py::t2",
               "t/c.py::t3", "t/d.py::t1"]
    seconds = {"t/a.py": 5.0, "t/b.py": 60.0, "t/d.py": 0.5}  # c: 3 tests, estimated 0.9 s
    assert longest_first(nodeids, seconds) == [
        "t/b.py::t1", "t/a.py::t1", "t/a.py::t2", "t/c.py::t1", "t/c.py::t2", "t/c.py::t3",
        "t/d.py::t1"]

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


def test_files_go_to_the_workers_longest_first():
    """tests/_suite_order.py: stored seconds order the files, longest first; a file with none is placed by its tests
    (0.3 s each); equal ones keep their order."""
    from _suite_order import longest_first

    scopes = {"t/a.py": 2, "t/b.py": 1, "t/c.py": 3, "t/d.py": 1, "t/e.py::Case": 1}
    seconds = {"t/a.py": 5.0, "t/b.py": 60.0, "t/d.py": 0.5, "t/e.py": 0.5}  # c: 3 tests, estimated 0.9 s
    assert longest_first(scopes, seconds) == ["t/b.py", "t/a.py", "t/c.py", "t/d.py", "t/e.py::Case"]


class _Worker:
    """What xdist's scheduler sees of a worker: the indexes it is sent, into the collection the worker holds."""

    def __init__(self, name):
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes):
        self.sent.append(list(indexes))

    def shutdown(self):
        self.shutting_down = True


def test_the_scheduler_sends_each_worker_whole_files_longest_first_as_indexes_into_its_own_collection():
    """The suite's scheduler (tests/_suite_guard.py's xdist hook), two workers that collected files a (1 test), b (3)
    and c (2), stored seconds putting c first: each worker's indexes, read in its own collection, are whole files,
    and the first two files out are c and b. Reordering the workers' collections, as a first version did, sent
    indexes the workers read in their own order: b's tests went to both workers."""
    from unittest import mock

    import _suite_order
    from _suite_guard import pytest_xdist_make_scheduler

    collection = ["t/a.py::t1", "t/b.py::t1", "t/b.py::t2", "t/b.py::t3", "t/c.py::t1", "t/c.py::t2"]
    config = mock.Mock()
    config.getvalue.side_effect = {"tx": ["2*popen"], "dist": "loadfile"}.__getitem__
    config.option.loadscopereorder = True
    with mock.patch.object(_suite_order, "stored", return_value={"t/c.py": 90.0, "t/b.py": 30.0, "t/a.py": 1.0}):
        scheduler = pytest_xdist_make_scheduler(config, None)
        workers = [_Worker("gw0"), _Worker("gw1")]
        for worker in workers:
            scheduler.add_node(worker)
        for worker in workers:
            scheduler.add_node_collection(worker, list(collection))
        scheduler.schedule()
    units = {w.gateway.id: [[collection[i] for i in sent] for sent in w.sent] for w in workers}
    files = {name: [{nodeid.split("::")[0] for nodeid in unit} for unit in sent] for name, sent in units.items()}
    assert all(len(unit) == 1 for sent in files.values() for unit in sent), units
    assert [files["gw0"][0], files["gw1"][0]] == [{"t/c.py"}, {"t/b.py"}], units
    sent = sorted(nodeid for sent in units.values() for unit in sent for nodeid in unit)
    assert sent == sorted(collection), units  # each test once

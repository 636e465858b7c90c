"""The suite always ends with a summary, on any CPU: a test that crashes its worker or hangs is one named failure.

A pytest plugin (``tests/conftest.py`` loads it), four parts:

- the first line of a run names the CPU (model, AVX2 / AVX-512 / avx512_bf16 / AMX), since a CPU kind decides what
  some dependencies' native kernels do;
- a per-test time limit in two layers: pytest-timeout's (``timeout`` in setup.cfg, ``@pytest.mark.timeout(N)`` for
  tests that need longer) fails a test stuck in Python and the run goes on; a hard limit a little later
  (:data:`GRACE_S`), armed with :func:`faulthandler.dump_traceback_later` whose C watchdog runs even when the test is
  stuck in native code holding the GIL, dumps every thread and ends the worker process;
- on a pytest-xdist worker, :mod:`faulthandler` writes to a file of its own, so that when a worker dies (a signal,
  the hard limit) the failure reported for its test names the signal and shows where the process was;
- xdist's scope schedulers (``--dist loadfile``, ``loadscope``, ``loadgroup``) re-queue a dead worker's whole file,
  the test that killed it included: it ran again and killed the next worker, and finished files re-queued as empty
  work left the replacement idle and the run waiting for ever. :class:`ReportCrashOnce` reports that test once and
  hands only the file's unfinished tests to the next worker.
"""
from __future__ import annotations

import faulthandler
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from _cpu_kind import describe as describe_cpu

#: seconds between pytest-timeout's limit (which fails the test in Python) and the hard limit (which ends the worker);
#: the ini option ``hard_timeout_grace`` changes it
GRACE_S = 60.0
#: how much of a dead worker's fault report goes into its test's failure
REPORT_LINES = 40


def pytest_addoption(parser):
    parser.addini("hard_timeout_grace", f"seconds after pytest-timeout's limit at which a test stuck in native code "
                  f"ends its worker (default {GRACE_S:.0f})", default=str(GRACE_S))


def _grace(config) -> float:
    return float(config.getini("hard_timeout_grace"))


# -- the CPU line ----------------------------------------------------------------------------------------------------

def pytest_report_header(config):
    return f"CPU: {describe_cpu()}"


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """The run's first line names the CPU, also under ``-q`` (which hides pytest's header)."""
    config = session.config
    if _is_worker(config) or config.get_verbosity() >= 0:
        return
    config.get_terminal_writer().line(f"CPU: {describe_cpu()}")


# -- time limits -----------------------------------------------------------------------------------------------------

def time_limit(item: pytest.Item) -> Optional[float]:
    """The test's pytest-timeout limit in seconds (its ``timeout`` marker, else ``--timeout``, else the ini value);
    None when it has none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value) or None
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option) or None
    try:
        return float(item.config.getini("timeout") or 0) or None
    except ValueError:
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arms the hard limit for the test's whole protocol (set-up, call, tear-down)."""
    limit = time_limit(item)
    if limit is not None:
        faulthandler.dump_traceback_later(limit + _grace(item.config), exit=True, file=_fault_file())
    try:
        yield
    finally:
        if limit is not None:
            faulthandler.cancel_dump_traceback_later()


# -- a worker's fault file -------------------------------------------------------------------------------------------

def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


_FAULT_FILE = None


def _fault_file():
    """Where :mod:`faulthandler` writes: the worker's own file, or the process's real stderr outside xdist (pytest
    may have replaced ``sys.stderr`` with a capture that has no file descriptor)."""
    return _FAULT_FILE if _FAULT_FILE is not None else sys.__stderr__


def _fault_path(folder: str, worker: str) -> Path:
    return Path(folder) / f"{worker}.faults"


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin has pointed it at stderr
def pytest_configure(config):
    global _FAULT_FILE
    if _is_worker(config):
        folder = config.workerinput.get("accelpatch_fault_folder")
        if folder:
            _FAULT_FILE = open(_fault_path(folder, config.workerinput["workerid"]), "w")
            faulthandler.enable(file=_FAULT_FILE, all_threads=True)
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        config._accelpatch_fault_folder = tempfile.mkdtemp(prefix="accelpatch-pytest-faults-")


def pytest_unconfigure(config):
    folder = getattr(config, "_accelpatch_fault_folder", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist, controller) Tells each worker where to write its fault reports."""
    folder = getattr(node.config, "_accelpatch_fault_folder", None)
    if folder:
        node.workerinput["accelpatch_fault_folder"] = folder


# -- a dead worker's test: reported once, with the cause ---------------------------------------------------------------

def _exit_status(node) -> Optional[int]:
    """The worker process's exit status where execnet's popen gateway shows it (negative: killed by that signal)."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    try:
        return popen.wait(timeout=5) if popen is not None else None
    except Exception:  # noqa: BLE001  (best effort: the report says less)
        return None


def death_cause(fault_report: str, status: Optional[int]) -> str:
    """What ended a worker, from faulthandler's report and the process's exit status."""
    for line in fault_report.splitlines():
        if line.startswith("Fatal Python error: "):
            cause = line[len("Fatal Python error: "):].strip()
            name = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                    "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
                    "Illegal instruction": "SIGILL"}.get(cause)
            return f"killed by {name} ({cause})" if name else f"fatal error: {cause}"
        if line.startswith("Timeout (") and line.rstrip().endswith(")!"):
            return (f"the hard time limit ({line[len('Timeout ('):-2]}) ended it: the test outlived its pytest-timeout "
                    "limit, stuck where Python could not interrupt it (native code holding the GIL)")
    if status is not None and status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    if status is not None:
        return f"the worker exited with status {status} (no fault report: os._exit or a kill from outside?)"
    return "the worker died (no fault report, exit status unknown)"


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """(xdist, controller) The dead worker's test: its failure says why the worker died and where it was."""
    node = getattr(report, "node", None)
    folder = getattr(getattr(node, "config", None), "_accelpatch_fault_folder", None)
    text = ""
    if node is not None and folder:
        try:
            text = _fault_path(folder, node.gateway.id).read_text(errors="replace")
        except OSError:
            pass
    cause = death_cause(text, _exit_status(node) if node is not None else None)
    lines = where_it_was(text)
    report.longrepr = "\n".join([f"{report.longrepr}: {cause}", *(["where it was:", *lines] if lines else [])])


def where_it_was(fault_report: str) -> list[str]:
    """faulthandler's report, shortened: the thread that faulted first (or, for a timeout, the threads that were not
    xdist's own message loop), without the list of extension modules."""
    head, threads = [], []
    for line in fault_report.splitlines():
        if not line.strip() or line.startswith("Extension modules:"):
            continue
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([line])
        elif threads:
            threads[-1].append(line)
        else:
            head.append(line)
    ours = [t for t in threads if t[0].startswith("Current thread")] or [
        t for t in threads if not all("execnet" in frame for frame in t[1:])]
    return [*head, *(line for thread in ours for line in thread)][:REPORT_LINES]


class ReportCrashOnce:
    """Mixed into xdist's scope schedulers: the test a dead worker was running counts once (xdist reports it as
    crashed) and is not run again; the rest of its file goes to the next worker; finished files stay finished; a
    replacement worker gets work once it has collected (two crashes close together made xdist hand work to one that
    had not: KeyError, INTERNALERROR), and never exactly one test: a worker runs a test only once it knows the next
    one (or that none follows), and xdist hands a replacement one file at a time, so a file of one unfinished test
    left it waiting for ever."""

    def _reschedule(self, node):
        if node not in self.registered_collections:
            return
        super()._reschedule(node)
        while not node.shutting_down and self._pending_of(self.assigned_work.get(node, {})) < 2:
            if self.workqueue:
                self._assign_work_unit(node)
            else:
                node.shutdown()  # runs what it holds, then ends

    def remove_node(self, node):
        workload = self.assigned_work.get(node)
        crashed = None
        if workload:
            crashed = next((nodeid for unit in workload.values() for nodeid, done in unit.items() if not done), None)
            for unit in workload.values():
                if crashed in unit:
                    unit[crashed] = True
            for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
                del workload[scope]  # re-queued, a finished file is empty work: the worker it goes to waits for ever
        super().remove_node(node)  # re-queues what is left and reschedules the live workers
        return crashed


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling, LoadGroupScheduling, LoadScopeScheduling

    base = {"loadscope": LoadScopeScheduling, "loadfile": LoadFileScheduling,
            "loadgroup": LoadGroupScheduling}.get(config.getvalue("dist"))
    if base is None:
        return None  # xdist's own: its other schedulers do not run a crashed test again
    from _suite_order import LongestFirst

    return type(f"CrashOnce{base.__name__}", (ReportCrashOnce, LongestFirst, base), {})(config, log)

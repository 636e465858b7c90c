"""The suite's files handed to pytest-xdist's workers longest first, so that two workers finish together.

Why: ``--dist loadfile`` keeps a file in one worker (module fixtures are built once), and xdist queues the files
with the most tests first. The slowest files have few tests (the trained tiny models generate dozens of videos in
five tests), so they came last, and one worker ran the last of them alone while the other had finished: the run's
wall time was the longer worker's. Here the queue is ordered by each file's seconds in the last measured run
(:data:`DURATIONS`, committed beside this file), longest first (the longest-processing-time rule); a file not
measured yet is placed by its number of tests (:data:`SECONDS_PER_TEST` each).

``pytest --store-durations`` (any selection, with or without xdist) writes the seconds of the files it ran into
:data:`DURATIONS`, keeping the others: run it on the whole suite after adding or changing a slow file.
"""
from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest

#: each test file's seconds (setup + call + teardown of its tests) in the last run that stored them
DURATIONS = Path(__file__).with_name("durations.json")
#: the estimate for a file with no stored seconds, per test
SECONDS_PER_TEST = 0.3


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write the seconds of each test file this run ran into {DURATIONS.name} (the order in "
                          "which xdist's workers get the files: longest first)")


def stored() -> dict[str, float]:
    """The stored seconds by test file (its path from the repository root), or nothing where the file is missing or
    unreadable."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(scopes: dict[str, int], seconds: dict[str, float]) -> list[str]:
    """The work units ``scopes`` (a test file, or a class in one, with its number of tests) in decreasing stored
    seconds of their file (estimated from the tests where none is stored); equal ones in the order they came."""
    return sorted(scopes, key=lambda scope: -seconds.get(file_of(scope), SECONDS_PER_TEST * scopes[scope]))


class LongestFirst:
    """Mixed into xdist's ``loadfile`` scheduler: its queue of files, once built, is put in :func:`longest_first`
    order before the first file goes out. Only the queue: the workers' collections stay as collected, since xdist
    sends each worker the indexes of its tests in the collection the worker holds (reordering the collections
    instead, as a first version did, handed workers other files' tests: files split across workers, their module
    fixtures built twice)."""

    _ordered = False

    def _assign_work_unit(self, node):
        if not self._ordered:
            self._ordered = True
            order = longest_first({scope: len(unit) for scope, unit in self.workqueue.items()}, stored())
            self.workqueue = OrderedDict((scope, self.workqueue[scope]) for scope in order)
        super()._assign_work_unit(node)


class _Recorder:
    """Adds up each file's seconds from the test reports (on xdist's controller the workers' reports arrive here)
    and writes them at the end of the session."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput") or not self.seconds:
            return
        merged = {**stored(), **{f: round(s, 1) for f, s in self.seconds.items()}}
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "suite-durations")

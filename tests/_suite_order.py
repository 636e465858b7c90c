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
from collections import defaultdict
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


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[str]:
    """``nodeids`` grouped by file, the files in decreasing stored (or estimated) seconds, each file's own order
    kept; equal files in the order they came."""
    files: dict[str, list[str]] = defaultdict(list)
    for nodeid in nodeids:
        files[file_of(nodeid)].append(nodeid)
    order = sorted(files, key=lambda f: -seconds.get(f, SECONDS_PER_TEST * len(files[f])))
    return [nodeid for f in order for nodeid in files[f]]


class LongestFirst:
    """Mixed into xdist's ``loadfile`` scheduler: before the first distribution, every worker's collection (they
    are identical, and xdist checks that) is put in :func:`longest_first` order, and xdist's own reordering by test
    count is turned off."""

    def schedule(self):
        if self.collection is None and self.collection_is_completed:
            seconds = stored()
            for node, collection in self.registered_collections.items():
                self.registered_collections[node] = longest_first(list(collection), seconds)
            self.config.option.loadscopereorder = False
        return super().schedule()


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

"""A pytest plugin that runs someone else's tests with accelpatch applied: every supported diffusers transformer
built during the session comes out of its constructor already patched by ``accelpatch.apply(model)`` at the
default tier (``lossless``: bit-identical to diffusers), so diffusers' own model tests check that accelpatch
changes nothing they can see.

    python -m pytest -p accelpatch.testing.diffusers_tests_plugin tests/models/transformers/test_models_transformer_wan.py

Options: ``--accelpatch-models wan,hunyuan_video15,ltx2`` (the default; ``all`` takes every supported class),
``--accelpatch-allow-unpatched`` (do not fail a session that patched nothing), ``--accelpatch-summary-json PATH``.
The classes' ``__init__`` are wrapped at configure time and restored at unconfigure. Warnings ``apply()`` gives
are recorded (not shown to the tests, which may assert on warnings) and listed in the summary, with the models
patched, the calls their fast paths took and the lossless fused-op calls that ran. A session that patched no
model fails: a run that tested nothing of accelpatch must not look green.
"""
from __future__ import annotations

import collections
import functools
import importlib
import json
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from accelpatch.core.outcomes import RAN
from accelpatch.models.families import families

#: ``--accelpatch-models`` names: the registered families whose diffusers model tests accelpatch runs
MODEL_FAMILIES = tuple(family.key for family in families() if family.diffusers_tests)
DEFAULT_MODELS = ",".join(MODEL_FAMILIES)
NOTHING_PATCHED = ("accelpatch plugin: no model was patched in this session (none built, or none with a module "
                   "accelpatch patches at the default tier), so these tests checked nothing of accelpatch (pass "
                   "--accelpatch-allow-unpatched if that is expected)")


def adapters_for(names: str) -> list:
    """The adapters named by ``--accelpatch-models`` (comma-separated keys of :data:`MODEL_FAMILIES`, or ``all``)."""
    from accelpatch.models.registry import ADAPTERS

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return list(ADAPTERS)
    unknown = [n for n in wanted if n not in MODEL_FAMILIES]
    if unknown or not wanted:
        raise pytest.UsageError(f"--accelpatch-models: unknown model name(s) {unknown or names!r}; valid: "
                                f"{', '.join(MODEL_FAMILIES)} (comma-separated) or all")
    by_key = {family.key: adapter for family, adapter in zip(families(), ADAPTERS)}
    return [by_key[n] for n in wanted]


@dataclass
class Patched:
    """One model the plugin patched: its class, the test that built it and its sites' counters (the counters
    only, so that the model itself can be freed)."""

    model_class: str
    test: str
    counters: list = field(default_factory=list, repr=False)


@dataclass
class PatchRecorder:
    """Wraps the classes' ``__init__`` so that each instance is patched as it is built, and keeps the tally."""

    classes: list[type]
    patched: list[Patched] = field(default_factory=list)
    #: apply() warnings and errors: message -> count
    warned: collections.Counter = field(default_factory=collections.Counter)
    refused: collections.Counter = field(default_factory=collections.Counter)
    current_test: str = "(collection)"
    _originals: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        for cls in self.classes:
            original = cls.__dict__["__init__"]
            self._originals[cls] = original
            cls.__init__ = self._wrapped(cls, original)

    def uninstall(self) -> None:
        for cls, original in self._originals.items():
            cls.__init__ = original
        self._originals.clear()

    def _wrapped(self, cls: type, original):
        recorder = self

        @functools.wraps(original)  # keeps __wrapped__: diffusers reads the signature of __init__ for the config
        def __init__(model, *args, **kwargs):
            original(model, *args, **kwargs)
            if type(model) is cls:  # a subclass's own __init__ finishes later; it is not a supported class
                recorder.patch(model)

        return __init__

    def patch(self, model) -> None:
        import accelpatch
        from accelpatch.core.model_state import patch_of

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                accelpatch.apply(model)
            except Exception as error:  # counted and shown in the summary; the test runs the unpatched model
                with self._lock:
                    self.refused[f"{type(model).__name__}: {type(error).__name__}: {error}"] += 1
                return
        patch = patch_of(model)
        with self._lock:
            self.warned.update(f"{type(model).__name__}: {w.message}" for w in caught)
            self.patched.append(Patched(type(model).__name__, self.current_test,
                                        [site.counters for site in patch.sites] if patch is not None else []))

    def summary(self) -> dict[str, Any]:
        """Models patched by class, their sites, fast calls and fused-op calls (op -> outcome -> calls)."""
        by_class: collections.Counter = collections.Counter(p.model_class for p in self.patched)
        fast, sites = 0, 0
        fused: dict[str, collections.Counter] = {}
        for p in self.patched:
            sites += len(p.counters)
            for counters in p.counters:
                totals = counters.totals()
                fast += totals["fast"]
                for key, n in totals["chains"].items():
                    if not n:
                        continue
                    op, _, outcome = key.partition("|")
                    fused.setdefault(op, collections.Counter())[outcome] += n
        fused_calls = sum(c.get(RAN, 0) for c in fused.values())
        return {"models_patched": len(self.patched), "by_class": dict(by_class),
                "models_with_sites": sum(1 for p in self.patched if p.counters), "sites": sites,
                "fast_calls": fast, "fused_op_calls": fused_calls,
                "fused_ops": {op: dict(c) for op, c in fused.items()},
                "tests_with_patched_models": len({p.test for p in self.patched}),
                "apply_warnings": dict(self.warned), "apply_refused": dict(self.refused)}


_RECORDER = pytest.StashKey[PatchRecorder]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("accelpatch", "accelpatch: patch every supported diffusers transformer at construction")
    group.addoption("--accelpatch-models", default=DEFAULT_MODELS,
                    help=f"models to patch: comma-separated {', '.join(MODEL_FAMILIES)}, or all "
                         f"(default {DEFAULT_MODELS})")
    group.addoption("--accelpatch-allow-unpatched", action="store_true",
                    help="do not fail the session when no model was patched")
    group.addoption("--accelpatch-summary-json", default=None, metavar="PATH",
                    help="also write the plugin's summary (models patched, fused-op calls) to PATH as JSON")


def pytest_configure(config) -> None:
    classes = []
    for adapter in adapters_for(config.getoption("accelpatch_models")):
        for module_name, class_name in adapter.model_classes:
            classes.append(getattr(importlib.import_module(module_name), class_name))
    recorder = PatchRecorder(classes)
    recorder.install()
    config.stash[_RECORDER] = recorder


def pytest_unconfigure(config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is not None:
        recorder.uninstall()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    recorder = item.config.stash.get(_RECORDER, None)
    if recorder is not None:
        recorder.current_test = item.nodeid
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    recorder = session.config.stash.get(_RECORDER, None)
    if recorder is None:
        return
    summary = recorder.summary()
    path = session.config.getoption("accelpatch_summary_json")
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    if nothing_patched(summary) and not session.config.getoption("accelpatch_allow_unpatched"):
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def nothing_patched(summary: dict[str, Any]) -> bool:
    """No model came out with a patched module (a model whose family patches nothing at the default tier, like
    HunyuanVideo 1.5 without a backend, runs unchanged and does not count)."""
    return summary["models_with_sites"] == 0


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as a reader sees it."""
    classes = ", ".join(f"{name} ×{n}" for name, n in sorted(summary["by_class"].items())) or "none"
    lines = [f"models patched at construction: {summary['models_patched']} ({classes}) in "
             f"{summary['tests_with_patched_models']} test(s), {summary['models_with_sites']} with patched modules; "
             f"{summary['sites']} sites, "
             f"{summary['fast_calls']} fast-path calls, {summary['fused_op_calls']} fused-op calls"]
    for op, outcomes in sorted(summary["fused_ops"].items()):
        lines.append(f"  {op}: " + ", ".join(f"{outcome} ×{n}" for outcome, n in sorted(outcomes.items())))
    for message, n in sorted(summary["apply_warnings"].items()):
        lines.append(f"  apply() warned ×{n}: {message}")
    for message, n in sorted(summary["apply_refused"].items()):
        lines.append(f"  apply() refused ×{n} (that model ran unpatched): {message}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None:
        return
    summary = recorder.summary()
    terminalreporter.section("accelpatch plugin")
    for line in summary_lines(summary):
        terminalreporter.write_line(line)
    if nothing_patched(summary) and not config.getoption("accelpatch_allow_unpatched"):
        terminalreporter.write_line(NOTHING_PATCHED, red=True)

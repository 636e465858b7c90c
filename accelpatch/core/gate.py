"""Quality-gated fusions: marking, mounting and the per-site state behind the tier contract.

A :class:`QualityGatedFusion` describes one kind of fast path (its marker and enabled attribute names and the tier
it needs). It keeps no per-site state: each marked module holds one record under the marker attribute (accelpatch's
:class:`~accelpatch.core.sites.Site`), and that record's ``mounted`` and ``reject_reason`` are the site's one mount
state, decided by the patcher and read by the gate, the report and the parallel checks alike. Mounting is all-or-nothing per model: one rejected site keeps the whole model on the reference path,
with the reason recorded.

A mounted site is *enabled* only when the tier in force in the calling context admits the fusion's tier, so
``is_enabled`` (and the enabled attribute as seen through a gated subclass) answers for the calling context.
"""
from __future__ import annotations

import collections
import importlib
import logging
import sys
import threading
from typing import Iterator, Optional

import torch

from accelpatch.core.tiers import DEFAULT_TIER, Tier, effective_tier
from accelpatch.core.torch_compat import is_exporting

logger = logging.getLogger("accelpatch")

#: the marker prefix of sglang diffusion's quality-gated sites (``_sgl_<name>_site`` / ``_sgl_<name>_enabled``), which
#: the fast paths ported from it carry
SGLANG_PREFIX = "_sgl"

#: every fusion ever defined, by name: a pickled gated module names its fusion, and the loading process finds it here
_FUSIONS: dict[str, "QualityGatedFusion"] = {}
_FUSIONS_LOCK = threading.Lock()


def fusion_by_name(name: str, defined_in: Optional[str] = None) -> "QualityGatedFusion":
    """The fusion called ``name``. Fusions register themselves when the module defining them is imported; a pickle
    names that module (``defined_in``), so a process that unpickles a patched model before importing it imports it
    here, without the gate knowing which modules define fusions."""
    if name not in _FUSIONS and defined_in:
        importlib.import_module(defined_in)
    try:
        return _FUSIONS[name]
    except KeyError:
        raise KeyError(f"no accelpatch fusion is called {name!r}; known fusions: {', '.join(sorted(_FUSIONS))}. "
                       "Was the model pickled by another version of accelpatch?") from None


#: why a count decided on the device was not read: the call ran on fake or meta tensors (a memory trace), which carry
#: no values
FAKE_UNCOUNTED = ("traced on fake or meta tensors (a memory plan): counts the device decides (which blocks a sparse "
                  "attention skipped) have no value and are not counted")


def _real_zero(dtype: torch.dtype) -> torch.Tensor:
    """A 0-dim zero tally on the CPU, real even when made under a fake-tensor mode (apply() inside a memory trace):
    a fake tally could never be read."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return torch.zeros((), dtype=dtype)


def _has_no_value(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is fake or on the meta device: shapes without values."""
    from torch._subclasses.fake_tensor import is_fake

    return tensor.device.type == "meta" or is_fake(tensor)


EXPORTED_UNCOUNTED = ("traced by torch.export: calls of the exported program (or an AOTInductor package made "
                      "from it) run outside accelpatch and are not counted")


@torch.library.custom_op("accelpatch::tally_add", mutates_args=("tally",))
def _tally_add(tally: torch.Tensor, value: Optional[torch.Tensor], increment: int) -> None:
    """Add ``value`` (or ``increment`` when None) to a counter tensor, as one opaque op compiled code keeps."""
    if value is None:
        tally.add_(increment)
    else:
        tally.add_(value.to(device=tally.device, dtype=tally.dtype))


class SiteCounters:
    """Thread-safe tallies of one site: calls that took the fast path, calls that ran the reference by reason
    (``fallbacks`` is the subset where the fast path was requested but could not run), notes on fast calls that
    ran differently than asked (``notes``: for example ``impl="upstream"`` running our own kernel), and sums of
    per-call statistics (for example the exact-block fraction of sparse attention), and the outcomes of the
    lossless fused ops its calls ran (``chains``: "op|outcome" -> calls, see accelpatch.lossless.verify)."""

    __slots__ = ("_lock", "fast", "reference", "fallbacks", "notes", "stat_sums", "stat_counts", "_compiled",
                 "uncounted", "chains", "_lazy")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fast = 0
        self.reference: collections.Counter[str] = collections.Counter()
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.notes: collections.Counter[str] = collections.Counter()
        self.chains: collections.Counter[str] = collections.Counter()
        self.stat_sums: dict[str, float] = {}
        self.stat_counts: dict[str, int] = {}
        #: tallies made inside torch.compile'd code: 0-dim tensors bumped in place (a Python int there would be a
        #: guarded constant, recompiling at every count; a lock would break the graph), keyed by (field, name)
        self._compiled: dict[tuple[str, str], torch.Tensor] = {}
        #: eager counts given as 0-dim tensors (a decision the device made, e.g. "did Sol-Attn skip a block"): summed
        #: on their device, read (one sync) only when the totals are
        self._lazy: dict[tuple[str, str], torch.Tensor] = {}
        #: why some calls could not be counted (None: every call was): set when the site was traced for export
        self.uncounted: Optional[str] = None

    def __getstate__(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in self.__slots__ if name != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # fields a pickle from an older accelpatch lacks start empty
        for name, value in state.items():
            setattr(self, name, value)

    def prepare(self, fields_and_names) -> None:
        """Create the compiled-code tallies of the reasons a site can count, ahead of time: a tally created inside
        compiled code changes what the code guarded on, and costs a recompile."""
        for field, name in fields_and_names:
            if (field, name) not in self._compiled:
                self._compiled[(field, name)] = _real_zero(torch.float64 if field == "stat_sums" else torch.int64)

    def _bump(self, field: str, name: str, value=None) -> bool:
        """Count inside traced code (see ``_compiled``); False when this trace is an export, whose program runs
        outside accelpatch's reach (``torch.export``, AOTInductor packages): nothing is counted then, and the
        report says so."""
        if is_exporting():
            self.uncounted = EXPORTED_UNCOUNTED
            return False
        key = (field, name)
        tally = self._compiled.get(key)
        if tally is None:
            tally = torch.zeros((), dtype=torch.float64 if field == "stat_sums" else torch.int64)
            self._compiled[key] = tally
        # A custom op that mutates the tally: an in-graph ``tally.add_(v)`` on a captured tensor is kept by the eager
        # backend but dropped by AOTAutograd whenever ``v`` is computed in the graph (measured: every statistic read
        # 0.0 under aot_eager and inductor while the constant increments survived).
        _tally_add(tally, value, 1)
        return True

    def _add_lazy(self, field: str, name: str, value: torch.Tensor) -> None:
        if _has_no_value(value):
            self.uncounted = FAKE_UNCOUNTED
            return
        with self._lock:
            known = self._lazy.get((field, name))
            self._lazy[(field, name)] = value.detach().long() if known is None else known + value.detach().long()

    def count_fast(self, value: Optional[torch.Tensor] = None) -> None:
        """One fast call; or, with ``value`` (a 0/1 tensor), one when the device says so, without a host sync."""
        if torch.compiler.is_compiling():
            self._bump("fast", "", value)
            return
        if value is not None:
            self._add_lazy("fast", "", value)
            return
        with self._lock:
            self.fast += 1

    def count_reference(self, reason: str, *, fallback: bool = False, value: Optional[torch.Tensor] = None) -> None:
        """One call that ran the reference for ``reason`` (``value``: a 0/1 tensor, as in :meth:`count_fast`)."""
        if torch.compiler.is_compiling():
            if self._bump("reference", reason, value) and fallback:
                self._bump("fallbacks", reason, value)
            return
        if value is not None:
            self._add_lazy("reference", reason, value)
            if fallback:
                self._add_lazy("fallbacks", reason, value)
            return
        with self._lock:
            self.reference[reason] += 1
            if fallback:
                self.fallbacks[reason] += 1

    def count_note(self, note: str) -> None:
        if torch.compiler.is_compiling():
            self._bump("notes", note)
            return
        with self._lock:
            self.notes[note] += 1

    def count_chain(self, op: str, outcome: str) -> None:
        """One call of the fused op ``op`` and how it went (accelpatch.lossless.verify's outcomes)."""
        name = f"{op}|{outcome}"
        if torch.compiler.is_compiling():
            self._bump("chains", name)
            return
        with self._lock:
            self.chains[name] += 1

    def add_stat(self, name: str, value) -> None:
        """Add one observation; a tensor stays a tensor (no host sync) until the mean is read."""
        if torch.compiler.is_compiling():
            if self._bump("stat_sums", name, value.detach()):
                self._bump("stat_counts", name)
            return
        if isinstance(value, torch.Tensor) and _has_no_value(value):
            self.uncounted = FAKE_UNCOUNTED
            return
        with self._lock:
            self.stat_sums[name] = self.stat_sums.get(name, 0.0) + value
            self.stat_counts[name] = self.stat_counts.get(name, 0) + 1

    def totals(self) -> dict:
        """Everything counted, eager and compiled calls together: fast, reference, fallbacks, notes (ints) and
        stat means."""
        with self._lock:
            out = {"fast": self.fast, "reference": collections.Counter(self.reference),
                   "fallbacks": collections.Counter(self.fallbacks), "notes": collections.Counter(self.notes),
                   "chains": collections.Counter(self.chains)}
            sums, counts = dict(self.stat_sums), dict(self.stat_counts)
            compiled = list(self._compiled.items()) + list(self._lazy.items())
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # the tallies are real; read them inside a memory trace too
            self._add_compiled(out, sums, counts, compiled)
            out["stats"] = {name: float(sums[name]) / n for name, n in counts.items() if n}
        out["uncounted"] = self.uncounted
        return out

    @staticmethod
    def _add_compiled(out: dict, sums: dict, counts: dict, compiled: list) -> None:
        for (field, name), tally in compiled:
            if field == "fast":
                out["fast"] += int(tally)
            elif field in ("reference", "fallbacks", "notes", "chains"):
                out[field][name] += int(tally)
            elif field == "stat_sums":
                sums[name] = sums.get(name, 0.0) + tally
            else:
                counts[name] = counts.get(name, 0) + int(tally)

    def mean_stat(self, name: str) -> Optional[float]:
        return self.totals()["stats"].get(name)

    def reset(self) -> None:
        with self._lock:
            self.fast = 0
            self.reference.clear()
            self.fallbacks.clear()
            self.notes.clear()
            self.chains.clear()
            self.stat_sums.clear()
            self.stat_counts.clear()
            for tally in self._compiled.values():
                tally.zero_()
            self._lazy.clear()
            self.uncounted = None


class WorkWatch:
    """Whether one eager call of a site did the work that makes it fast (a fused op that fused), where the path
    cannot tell from its own code: the ops it calls decide per call. Watches nest per thread (a block site calling
    its attention site): :func:`note_work` marks the innermost watch of the counting site."""

    __slots__ = ("counters", "did_work")

    _open = threading.local()

    def __init__(self, counters: SiteCounters) -> None:
        self.counters, self.did_work = counters, False

    def __enter__(self) -> "WorkWatch":
        stack = getattr(WorkWatch._open, "stack", None)
        if stack is None:
            stack = WorkWatch._open.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        WorkWatch._open.stack.pop()


def note_work(counters: SiteCounters) -> None:
    """Mark the innermost open :class:`WorkWatch` of ``counters`` (in this thread): its call did fast work."""
    for watch in reversed(getattr(WorkWatch._open, "stack", ())):
        if watch.counters is counters:
            watch.did_work = True
            return


class QualityGatedFusion:
    """One kind of fast path: the names of its marker and enabled attributes, and the tier it needs.

    ``marker_attr`` holds a patched module's :class:`~accelpatch.core.sites.Site`, the one record of its mount state
    (``mounted``, ``reject_reason``), which the patcher decides; ``enabled_attr`` reads True only for a mounted site
    whose tier the calling context admits (a property of accelpatch's gated classes: another caller setting it, as
    sglang's site protocol does, turns the site off, or on again where the patcher did not reject it).
    """

    __slots__ = ("name", "marker_attr", "enabled_attr", "tier", "defined_in")

    def __init__(self, *, name: str, marker_attr: str, enabled_attr: str, tier: Tier = Tier.HIGH,
                 defined_in: Optional[str] = None) -> None:
        self.name = name
        #: the module that defines this fusion (importing it registers the fusion): the caller's, by default
        self.defined_in = defined_in or sys._getframe(1).f_globals.get("__name__")
        self.marker_attr = marker_attr
        self.enabled_attr = enabled_attr
        self.tier = tier
        with _FUSIONS_LOCK:
            known = _FUSIONS.get(name)
            if known is not None and (known.marker_attr, known.enabled_attr) != (marker_attr, enabled_attr):
                raise ValueError(f"a different fusion is already called {name!r}")
            _FUSIONS.setdefault(name, self)

    @classmethod
    def named(cls, name: str, tier: Tier, prefix: str = "_accelpatch") -> "QualityGatedFusion":
        """A fusion whose marker and enabled attributes are named after it (``<prefix>_<name>_site`` and
        ``<prefix>_<name>_enabled``), defined in the caller's module. The fast paths sglang defined first keep its
        names (``prefix=SGLANG_PREFIX``), so code written against its site protocol finds them."""
        return cls(name=name, marker_attr=f"{prefix}_{name}_site", enabled_attr=f"{prefix}_{name}_enabled",
                   tier=tier, defined_in=sys._getframe(1).f_globals.get("__name__"))

    def __reduce__(self):
        # Pickled by name, so a loaded model shares the process's fusion objects instead of carrying copies.
        return fusion_by_name, (self.name, self.defined_in)

    def __repr__(self) -> str:
        return f"QualityGatedFusion(name={self.name!r}, tier={self.tier})"

    def mark(self, module: torch.nn.Module, site: object) -> None:
        """Make ``module`` a site of this fusion, ``site`` its record; a freshly marked site starts unmounted."""
        site.mounted = False
        module.__dict__[self.marker_attr] = site

    def unmark(self, module: torch.nn.Module) -> None:
        """Remove every attribute :meth:`mark` put on ``module``."""
        for attr in (self.marker_attr, self.enabled_attr):
            module.__dict__.pop(attr, None)

    def record(self, module: torch.nn.Module) -> Optional[object]:
        """The site record of ``module`` (None when it is not a site of this fusion)."""
        return module.__dict__.get(self.marker_attr)

    def is_enabled(self, module: torch.nn.Module) -> bool:
        """True when ``module`` is a mounted site and the calling context's tier admits this fusion."""
        record = self.record(module)
        if record is None or not record.mounted:
            return False
        default = getattr(getattr(record, "model", None), "default_tier", DEFAULT_TIER)
        return effective_tier(default).admits(self.tier)

    def iter_sites(self, root: torch.nn.Module) -> Iterator[torch.nn.Module]:
        for module in root.modules():
            if self.marker_attr in module.__dict__:
                yield module

"""``report(target)``: what accelpatch did to a model and what ran since, as data and as a readable table."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from html import escape
from typing import Any, Callable, Optional

from accelpatch.core import features
from accelpatch.core.model_state import patch_of
from accelpatch.core.steps import UNKNOWN as UNKNOWN_STEP
from accelpatch.core.outcomes import DECLINED, NOT_APPLICABLE, RAN
from accelpatch.core.tiers import offers_high


@dataclass(frozen=True)
class SiteReport:
    """One patched module: where it is, what it needs, whether it mounted, and how its calls went."""

    path: str
    kind: str
    tier: str
    mounted: bool
    reason: Optional[str]
    fast_calls: int
    reference_calls: dict[str, int]
    fallback_calls: dict[str, int]
    stats: dict[str, float] = field(default_factory=dict)
    #: fast calls that ran differently than asked, by note (e.g. impl="upstream" running our own kernel)
    notes: dict[str, int] = field(default_factory=dict)
    #: why some calls are missing from the counts above (None: every call was counted)
    uncounted: Optional[str] = None
    #: the lossless fused ops this site's calls ran: op -> {"ran" or the outcome of a reference run: calls}
    fused_ops: dict[str, dict[str, int]] = field(default_factory=dict)
    #: what a fast call here did: "fused", "sparse" or "approximate" (see FAST_KINDS)
    work: str = "approximate"

    @property
    def status(self) -> str:
        return "mounted" if self.mounted else "rejected"

    @property
    def outcomes(self) -> dict:
        """This site's calls in the one vocabulary (:mod:`accelpatch.core.outcomes`): ``{"ran": calls,
        "declined": {reason: calls}, "not applicable": {reason: calls}}``; a declined call ran the reference too, so
        ``reference_calls`` holds both kinds."""
        return {RAN: self.fast_calls, DECLINED: dict(self.fallback_calls),
                NOT_APPLICABLE: {r: n - self.fallback_calls.get(r, 0) for r, n in self.reference_calls.items()
                                 if n > self.fallback_calls.get(r, 0)}}


@dataclass(frozen=True)
class FusionReport:
    """One lossless fused op on one model: its sites, its calls, and its first-sight verdicts in this process."""

    op: str
    description: str
    #: the modules whose fast paths call the op
    sites: int
    fused_calls: int
    #: calls that ran the reference chain, by outcome ("declined: ...", "not applicable: inside torch.compile ...")
    reference_calls: dict[str, int]
    #: (signature, check seconds) of each verified signature
    verified: tuple[tuple[str, float], ...]
    #: (signature, reason, check seconds) of each declined signature
    declined: tuple[tuple[str, str, float], ...]

    @property
    def check_s(self) -> float:
        return sum(v[1] for v in self.verified) + sum(d[2] for d in self.declined)

    def line(self) -> str:
        refs = "".join(f", {n} {r.partition(': ')[0]} ({r.partition(': ')[2]})"  # "declined: why" -> declined (why)
                       for r, n in sorted(self.reference_calls.items(), key=lambda x: -x[1]))
        if not self.fused_calls and not refs:
            return (f"{self.op} on {self.sites} site(s): not called (no call of its sites reached it: see the table "
                    "below for why those calls ran as they did)")
        return (f"{self.op} on {self.sites} site(s): {self.fused_calls} ran{refs}; signatures (this process) verified "
                f"{len(self.verified)}, declined {len(self.declined)}")


def merge_counts(dicts) -> dict[str, int]:
    """Sum counts by key over several ``{key: count}`` mappings."""
    out: dict[str, int] = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


#: what a counted fast call did, for ``assert_fast_path_ran(kind=...)``: a bit-exact fused op fused ("fused"),
#: Sol-Attn skipped attention blocks ("sparse"), an approximate high-tier path ran ("approximate"), or a step cache
#: reused a transformer call's blocks ("cache")
FAST_KINDS = ("fused", "sparse", "approximate", "cache")
#: the tiers ``assert_fast_path_ran(kind=...)`` also takes: any fast call at that tier
TIERS = ("lossless", "high")


class _Tally:
    """Totals over ``self.sites``, shared by the per-model and the whole report. Only calls that did fast work
    count as fast: a fused site call whose every op ran its eager chain, or a Sol-Attn call that skipped nothing,
    counts as a reference call with that reason."""

    sites: tuple[SiteReport, ...]

    @property
    def fast_calls(self) -> int:
        return sum(s.fast_calls for s in self.sites)

    @property
    def fast_calls_by_tier(self) -> dict[str, int]:
        """Fast calls at each tier: {"lossless": bit-exact fused calls, "high": approximate ones, step-cache reuse
        included}."""
        out = {"lossless": 0, "high": 0}
        for s in self.sites:
            out[s.tier] = out.get(s.tier, 0) + s.fast_calls
        out["high"] += self.reused_calls
        return out

    @property
    def fast_calls_by_kind(self) -> dict[str, int]:
        """Fast calls by what they did (:data:`FAST_KINDS`)."""
        out = dict.fromkeys(FAST_KINDS, 0)
        for s in self.sites:
            out[s.work] += s.fast_calls
        out["cache"] += self.reused_calls
        return out

    @property
    def fallback_calls(self) -> dict[str, int]:
        return merge_counts(s.fallback_calls for s in self.sites)

    @property
    def reference_calls(self) -> dict[str, int]:
        return merge_counts(s.reference_calls for s in self.sites)


@dataclass(frozen=True)
class ModelReport(_Tally):
    model_class: str
    family: str
    backend: Optional[str]
    default_tier: str
    strict: bool
    sites: tuple[SiteReport, ...]
    #: where each call's denoising step came from (see accelpatch.core.steps), for models with a step-based policy
    step_sources: dict[str, int] = field(default_factory=dict)
    #: the latest pipeline call's steps a step policy kept dense, with why, in that call's own step numbers:
    #: ``{"total": N or None, "steps": {step: {reason: site calls}}}`` (None: no such step; eager calls only)
    dense_steps: Optional[dict[str, Any]] = None
    #: the family's own options in force (e.g. SANA-Video 2.0's anchor_fp32_steps)
    options: dict[str, Any] = field(default_factory=dict)
    #: the step cache: its settings ("method") and, since the last reset, transformer calls whose remaining blocks
    #: were "computed" or "reused", with the "reasons" reuse was not allowed; None without a cache
    cache: Optional[dict[str, Any]] = None
    #: the lossless fused ops of this model's sites (accelpatch.lossless.verify)
    fusions: tuple[FusionReport, ...] = ()
    #: several processes: "sequence" (ranks the tokens are split over, 1 when not split) and "cfg" (CFG
    #: parallelism's calls split / run whole by reason, None when it is off); None on one process
    parallel: Optional[dict[str, Any]] = None
    #: whether a hosted feature (the step cache) gives tier high something to do on this model
    features_offer_high: bool = False
    #: every hosted feature's section (accelpatch.core.features: its ``report_field`` → what it reported)
    sections: dict[str, Any] = field(default_factory=dict)

    def feature_lines(self) -> list[str]:
        """One line per hosted feature with something to say (accelpatch.core.features: the step cache,
        parallelism, ...), from the sections they filled in."""
        lines = []
        for f in features.registered():
            section = self.sections.get(f.report_field) if f.report_field else None
            line = f.report_line(section) if section is not None else None
            if line:
                lines.append(line)
        return lines

    def fusion_lines(self) -> list[str]:
        """What the lossless fusions did: per op its calls and verdicts, each declined signature with its reason."""
        if not self.fusions:
            return []
        check = sum(f.check_s for f in self.fusions)
        # no "saved" figure: an op's own time is not the call's (the gate costs time too); bench measures the net
        lines = [f"lossless fusions (bit-exact; each input signature checked against the eager chain on first sight, "
                 f"{check * 1e3:.1f} ms of checks in this process; their net speed: accelpatch.bench):"]
        for f in features.registered():  # e.g. the CPU kernel build: a one-off per machine, not a cost of the checks
            lines.extend(f"  {note}" for note in f.notes())
        for f in self.fusions:
            lines.append("  " + f.line())
            lines.extend(f"    declined {sig}: {reason}" for sig, reason, _ in f.declined)
        return lines

    @property
    def tier_statement(self) -> str:
        """The model's default tier, said plainly."""
        if not self.sites:
            return "nothing to patch here: it runs unchanged"
        if self.default_tier == "high":
            why = f" (backend {self.backend} is approximate)" if self.backend else " (apply(..., tier='high'))"
            return (f"runs at tier high by default{why}; quality('lossless') (the bit-exact fused kernels) or "
                    "quality('exact') (the original diffusers path) gives diffusers' bits")
        high = ("quality('high') opts in to the approximate fast paths" if self.has_high_path else
                "this model has no high fast path without backend= or cache= (quality('high') runs the lossless path)")
        if self.default_tier == "lossless" and self.fusions:
            return ("runs at tier lossless by default (bit-exact fused kernels: bit-identical to the unpatched "
                    f"model); {high}")
        return f"runs at tier {self.default_tier} by default (bit-identical to the unpatched model); {high}"

    @property
    def has_high_path(self) -> bool:
        """Whether ``quality("high")`` can run anything approximate here: a high-tier site, or a step cache."""
        return offers_high((s.tier for s in self.sites), self.features_offer_high)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[str]]:
        """(header, rows, numbered notes) of the per-site table; cells refer to notes as [n]. Sites rejected because
        one site of the model was ("model rejected at P: R") share that site's note: one cause, one note."""
        header = ("site", "kind", "tier", "status", "ran", "did not run: declined / not applicable (by reason)")
        rows, notes = [], []

        def note(text: str) -> str:
            if text not in notes:
                notes.append(text)
            return f"[{notes.index(text) + 1}]"

        causes = {}
        for s in self.sites:
            if s.reason and s.reason.startswith(MODEL_REJECTED):
                where, _, why = s.reason[len(MODEL_REJECTED):].partition(": ")
                causes[s.path] = causes[where] = f"{why} (at {where}; one rejected site keeps every site of its kind " \
                                                 "on the reference path)"
        for s in self.sites:
            outcomes = s.outcomes
            rejection = None if s.mounted else causes.get(s.path, s.reason or "unknown")

            def cause(kind: str, reason: str) -> str:  # a call to a rejected site: the rejection's own note
                return rejection if rejection is not None and reason.startswith("not mounted: ") else f"{kind}: {reason}"
            ref = " ".join(f"{n}×{note(cause(kind, r))}" for kind in (DECLINED, NOT_APPLICABLE)
                           for r, n in sorted(outcomes[kind].items(), key=lambda x: -x[1]))
            status = s.status if s.mounted else f"rejected {note(rejection)}"
            extra = "".join(f" {k}={v:.3f}" for k, v in s.stats.items())
            extra += "".join(f" {n}×{note(text)}" for text, n in sorted(s.notes.items(), key=lambda x: -x[1]))
            rows.append((s.path, s.kind, s.tier, status, f"{s.fast_calls}{extra}", ref or "-"))
        return header, rows, notes

    def headline(self) -> str:
        options = "".join(f" {k}={_shown(v)}" for k, v in self.options.items())
        tiers = self.fast_calls_by_tier
        return (f"{self.model_class} ({self.family}) backend={self.backend or 'none'}{options}"
                f"{' strict' if self.strict else ''}: {len(self.sites)} sites, fast calls: {tiers['lossless']} "
                f"lossless, {tiers['high']} high; {self.tier_statement}")

    @property
    def reused_calls(self) -> int:
        """Transformer calls whose remaining blocks the step cache reused (0 without a cache)."""
        return self.cache["reused"] if self.cache else 0

    def uncounted_line(self) -> Optional[str]:
        reasons = sorted({s.uncounted for s in self.sites if s.uncounted})
        return f"not counted: {'; '.join(reasons)}" if reasons else None

    def step_line(self) -> Optional[str]:
        if not self.step_sources:
            return None
        counts = ", ".join(f"{source} ×{n}" for source, n in sorted(self.step_sources.items(), key=lambda x: -x[1]))
        unknown = self.step_sources.get(UNKNOWN_STEP, 0)
        warning = (f" — {unknown} call(s) had no known step, so the step-based policy (dense_steps) could not apply"
                   if unknown else "")
        return f"step clock: {counts}{warning}"

    def dense_steps_line(self) -> Optional[str]:
        """The latest call's dense steps, runs of steps with the same reasons as ranges: "steps 0-1 (dense step)"."""
        if not self.dense_steps:
            return None
        runs: list[list] = []
        for step, reasons in self.dense_steps["steps"].items():
            kinds = tuple(sorted(reasons))
            if runs and runs[-1][2] == kinds and runs[-1][1] == step - 1:
                runs[-1][1] = step
            else:
                runs.append([step, step, kinds])
        total = self.dense_steps["total"]
        of = f" of {total} steps" if total else ""
        parts = [f"step{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''} ({', '.join(k)})" for a, b, k in runs]
        return f"dense in the latest call{of}: {'; '.join(parts)}"


#: how the patcher words a site rejected because another site of its model was (see patcher._mount)
MODEL_REJECTED = "model rejected at "


def _shown(value: Any) -> str:
    """An option's value as a user would write it (layer sets as "3,7"; an empty one as "none")."""
    if isinstance(value, (set, frozenset, list, tuple)):
        return ",".join(map(str, sorted(value))) if value else "none"
    return str(value)


@dataclass(frozen=True)
class Report(_Tally):
    """Per model, per site: mount status with reason, fast-path calls, reference calls by reason. ``str()`` is a
    table (and a notebook shows it as one); the fields are for programs (``report.models[0].sites[3]``)."""

    models: tuple[ModelReport, ...]
    #: set on the report apply() returns: undoes that apply (see __enter__)
    _undo: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)
    #: the process-wide counts of the ``sol_attn`` attention backend (``set_attention_backend("sol_attn")``), where
    #: the reported models have processors set to it (accelpatch.sol_attn.diffusers_backend)
    attention_backend: Optional[Any] = None

    def undone_by(self, undo: Callable[[], None]) -> "Report":
        return dataclasses.replace(self, _undo=undo)

    def __enter__(self):
        """``with accelpatch.apply(pipe):`` is a mistake that would leave the pipeline patched after the block:
        undo the patch and say what to write instead."""
        undone = self._undo is not None
        if undone:
            self._undo()
        raise TypeError("accelpatch.apply() patches at once and returns a report; it is not a context manager"
                        + ("; the patch it made has been undone" if undone else "")
                        + ". To patch for one block only, write `with accelpatch.patched(pipe, ...):`.")

    def __exit__(self, *exc) -> None:  # pragma: no cover - __enter__ always raises
        return None

    @property
    def sites(self) -> tuple[SiteReport, ...]:
        return tuple(s for m in self.models for s in m.sites)

    @property
    def reused_calls(self) -> int:
        """Transformer calls whose remaining blocks a step cache reused, over all models."""
        return sum(m.reused_calls for m in self.models)

    @property
    def fast_calls_by_kind(self) -> dict[str, int]:
        """Fast calls by what they did (:data:`FAST_KINDS`), the ``sol_attn`` attention backend's sparse calls
        included."""
        out = super().fast_calls_by_kind
        if self.attention_backend is not None:
            out["sparse"] += self.attention_backend.sparse_calls
        return out

    @property
    def fast_calls_by_tier(self) -> dict[str, int]:
        """Fast calls at each tier, the ``sol_attn`` attention backend's sparse calls counted as high."""
        out = super().fast_calls_by_tier
        if self.attention_backend is not None:
            out["high"] += self.attention_backend.sparse_calls
        return out

    def assert_fast_path_ran(self, kind: Optional[str] = None) -> None:
        """Raise AssertionError unless something fast ran — of ``kind`` when given: one of :data:`FAST_KINDS`
        ("fused", "sparse", "approximate", "cache") or a tier ("lossless", "high"). A guard against silent no-ops
        in tests and scripts: a call that entered a fast path but did no fast work (every fused op ran its eager
        chain, Sol-Attn skipped nothing) does not count."""
        if kind is not None and kind not in FAST_KINDS + TIERS:
            raise ValueError(f"kind must be one of {', '.join(FAST_KINDS + TIERS)} (or None for any), got {kind!r}")
        counts = self.fast_calls_by_kind
        ran = self.fast_calls_by_tier[kind] if kind in TIERS else counts[kind] if kind else sum(counts.values())
        if ran == 0:
            uncounted = "".join(f"; {line}" for m in self.models for line in [m.uncounted_line()] if line)
            ran = ", ".join(f"{k} {n}" for k, n in counts.items() if n)
            what = f"no {kind} fast path" if kind else "no accelpatch fast path"
            raise AssertionError(f"{what} ran{f' (fast calls by kind: {ran})' if ran else ''}; reference calls by "
                                 f"reason: {self.reference_calls}{uncounted}")

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = {"models": [asdict(m) for m in self.models]}
        if self.attention_backend is not None:
            out["attention_backend"] = asdict(self.attention_backend)
        return out

    def __str__(self) -> str:
        backend = [] if self.attention_backend is None else [str(self.attention_backend)]
        if not self.models:
            return "\n".join(backend or ["accelpatch: nothing is patched"])
        lines = backend
        for m in self.models:
            lines.append(m.headline())
            for extra in (m.uncounted_line(), m.step_line(), m.dense_steps_line(), *m.feature_lines()):
                if extra:
                    lines.append("  " + extra)
            lines.extend("  " + line for line in m.fusion_lines())
            header, rows, notes = m.table()
            if not rows:
                continue
            widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
            for row in [header] + rows:
                lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
            lines.extend(f"  [{i}] {text}" for i, text in enumerate(notes, 1))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        backend = [] if self.attention_backend is None else [f"<p>{escape(str(self.attention_backend))}</p>"]
        if not self.models:
            return "\n".join(backend or ["<p>accelpatch: nothing is patched</p>"])
        parts = backend
        for m in self.models:
            parts.append(f"<p><b>{escape(m.headline())}</b></p>")
            for extra in (m.uncounted_line(), m.step_line(), m.dense_steps_line(), *m.feature_lines()):
                if extra:
                    parts.append(f"<p>{escape(extra)}</p>")
            if m.fusion_lines():
                parts.append("<pre>" + escape("\n".join(m.fusion_lines())) + "</pre>")
            header, rows, notes = m.table()
            if not rows:
                continue
            cells = lambda row, tag: "".join(f"<{tag}>{escape(str(c))}</{tag}>" for c in row)  # noqa: E731
            parts.append("<table><thead><tr>" + cells(header, "th") + "</tr></thead><tbody>"
                         + "".join(f"<tr>{cells(row, 'td')}</tr>" for row in rows) + "</tbody></table>")
            if notes:
                parts.append("<ol>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ol>")
        return "\n".join(parts)


def build_report(models, *, reset: bool = False) -> Report:
    out = []
    for model in models:
        patch = patch_of(model)
        if patch is None:
            continue
        sites = []
        for site in patch.sites:
            c = site.counters
            totals = c.totals()
            sites.append(SiteReport(
                path=site.path, kind=site.kind, tier=str(site.tier), mounted=site.mounted,
                reason=site.reject_reason, fast_calls=totals["fast"],
                reference_calls={k: v for k, v in totals["reference"].items() if v},
                fallback_calls={k: v for k, v in totals["fallbacks"].items() if v}, stats=totals["stats"],
                notes={k: v for k, v in totals["notes"].items() if v}, uncounted=totals["uncounted"],
                fused_ops=_by_op(totals["chains"]), work=site.fast_path.work))
            if reset:
                c.reset()
        step_sources = dict(patch.step_sources.counts)
        dense_steps = patch.step_sources.latest_call()
        if reset:
            patch.step_sources.reset()
        backend = getattr(patch.backend, "name", None)
        options = dataclasses.asdict(patch.options) if dataclasses.is_dataclass(patch.options) else {}
        sections = {f.report_field: f.report(model, patch, reset) for f in features.registered() if f.report_field}
        out.append(ModelReport(model_class=patch.model_class, family=patch.adapter.family, backend=backend,
                               default_tier=str(patch.default_tier), strict=patch.strict, sites=tuple(sites),
                               step_sources=step_sources, dense_steps=dense_steps, options=options,
                               fusions=_fusions(patch.sites, sites),
                               features_offer_high=patch.features_offer_high(), sections=sections,
                               **{k: v for k, v in sections.items() if k in _MODEL_REPORT_FIELDS}))
    return Report(models=tuple(out))


#: the report sections that are also ModelReport fields of their own (report.models[0].cache, .parallel)
_MODEL_REPORT_FIELDS = ("cache", "parallel")


def _by_op(chains: dict[str, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key, count in chains.items():
        if count:
            op, _, outcome = key.partition("|")
            out.setdefault(op, {})[outcome] = count
    return out


def _fusions(patch_sites, site_reports) -> tuple[FusionReport, ...]:
    """Per fused op of the model's fast paths: its sites, calls (from the site reports) and verdicts."""
    ops = {}
    for site in patch_sites:  # sites stacked on one module count once: the module is where the op runs
        for op in site.fast_path.fused_ops:
            feature = getattr(op, "feature", None)  # an op only a feature runs (memory="low"'s chunks): shown with it
            if feature is not None and site.model.configs.get(feature) is None:
                continue
            ops.setdefault(op.name, (op, set()))[1].add(site.path)
    out = []
    for name, (op, paths) in ops.items():
        count = len(paths)
        calls = merge_counts(s.fused_ops.get(name, {}) for s in site_reports)
        verdicts = op.verdicts()
        verified = tuple((v.described, v.cost_s) for v in verdicts if v.verified)
        declined = tuple((v.described, v.reason, v.cost_s) for v in verdicts if v.declined)
        out.append(FusionReport(op=name, description=op.description, sites=count, fused_calls=calls.get(RAN, 0),
                                reference_calls={k: v for k, v in calls.items() if k != RAN},
                                verified=verified, declined=declined))
    return tuple(out)

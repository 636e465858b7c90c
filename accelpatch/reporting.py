"""``report(target)``: what accelpatch did to a model and what ran since, as data and as a readable table."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


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

    @property
    def status(self) -> str:
        return "mounted" if self.mounted else "rejected"


def _merge(dicts) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


class _Tally:
    """Totals over ``self.sites``, shared by the per-model and the whole report."""

    sites: tuple[SiteReport, ...]

    @property
    def fast_calls(self) -> int:
        return sum(s.fast_calls for s in self.sites)

    @property
    def fallback_calls(self) -> dict[str, int]:
        return _merge(s.fallback_calls for s in self.sites)

    @property
    def reference_calls(self) -> dict[str, int]:
        return _merge(s.reference_calls for s in self.sites)


@dataclass(frozen=True)
class ModelReport(_Tally):
    model_class: str
    family: str
    backend: Optional[str]
    default_tier: str
    strict: bool
    sites: tuple[SiteReport, ...]


@dataclass(frozen=True)
class Report(_Tally):
    """Per model, per site: mount status with reason, fast-path calls, reference calls by reason. ``str()`` is a
    table; the fields are for programs (``report.models[0].sites[3].fallback_calls``)."""

    models: tuple[ModelReport, ...]

    @property
    def sites(self) -> tuple[SiteReport, ...]:
        return tuple(s for m in self.models for s in m.sites)

    def assert_fast_path_ran(self) -> None:
        """Raise AssertionError unless some fast path ran: a guard against silent no-ops in tests and scripts."""
        if self.fast_calls == 0:
            raise AssertionError(f"no accelpatch fast path ran; reference calls by reason: {self.reference_calls}")

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"models": [asdict(m) for m in self.models]}

    def __str__(self) -> str:
        if not self.models:
            return "accelpatch: nothing is patched"
        lines = []
        for m in self.models:
            lines.append(f"{m.model_class} ({m.family}) backend={m.backend or 'none'} default tier={m.default_tier}"
                         f"{' strict' if m.strict else ''}: {len(m.sites)} sites, {m.fast_calls} fast calls")
            header = ("site", "kind", "tier", "status", "fast", "reference (by reason)")
            rows = []
            reasons: list[str] = []

            def note(text: str) -> str:
                if text not in reasons:
                    reasons.append(text)
                return f"[{reasons.index(text) + 1}]"

            for s in m.sites:
                ref = " ".join(f"{n}×{note(r)}" for r, n in sorted(s.reference_calls.items(), key=lambda x: -x[1]))
                status = s.status if s.mounted else f"rejected {note(s.reason or 'unknown')}"
                extra = "".join(f" {k}={v:.3f}" for k, v in s.stats.items())
                rows.append((s.path, s.kind, s.tier, status, f"{s.fast_calls}{extra}", ref or "-"))
            widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
            for row in [header] + rows:
                lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
            lines.extend(f"  [{i}] {text}" for i, text in enumerate(reasons, 1))
        return "\n".join(lines)


def build_report(models, *, reset: bool = False) -> Report:
    from .patcher import patch_of

    out = []
    for model in models:
        patch = patch_of(model)
        if patch is None:
            continue
        sites = []
        for site in patch.sites:
            module = model.get_submodule(site.path)
            c = site.counters
            stats = {name: c.mean_stat(name) for name in c.stat_counts}
            sites.append(SiteReport(
                path=site.path, kind=site.kind, tier=str(site.tier), mounted=site.is_mounted(module),
                reason=site.reject_reason, fast_calls=c.fast, reference_calls=dict(c.reference),
                fallback_calls=dict(c.fallbacks), stats={k: v for k, v in stats.items() if v is not None}))
            if reset:
                c.reset()
        backend = getattr(patch.backend, "name", None)
        out.append(ModelReport(model_class=patch.model_class, family=patch.adapter.family, backend=backend,
                               default_tier=str(patch.default_tier), strict=patch.strict, sites=tuple(sites)))
    return Report(models=tuple(out))

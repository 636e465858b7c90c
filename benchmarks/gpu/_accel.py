"""accelpatch plumbing shared by the sections: building models on the target device, patching for one block of
work, and reading back what the fast paths did (fast calls per forward, fallback reasons, exact fraction).

Every number a section reports next to a timing comes from ``accelpatch.report``, so a row whose fast path fell
back says so (``fast_calls`` 0 and the reason) instead of passing off the reference's time as the fast path's.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

import accelpatch
from _timing import Timing, timed


def build_on(device: str, factory: Callable[..., torch.nn.Module], *args: Any, **kwargs: Any) -> torch.nn.Module:
    """``factory(*args, device=device, **kwargs)`` with ``device`` as the default device, so that release-sized
    weights are initialised where they will run (no CPU init and copy of billions of parameters)."""
    with torch.device(device):
        return factory(*args, device=device, **kwargs)


def seeded_generator(device: str, seed: int) -> torch.Generator | None:
    """A generator on ``device`` (CUDA refuses a CPU generator for a CUDA tensor), or None on the dry run's meta
    device, which has no generators and no values to draw."""
    if torch.device(device).type == "meta":
        return None
    return torch.Generator(device=device).manual_seed(seed)


@contextlib.contextmanager
def patched(model: torch.nn.Module, **options: Any) -> Iterator[None]:
    """``accelpatch.apply(model, **options)`` for the enclosed block, then ``accelpatch.remove(model)``."""
    accelpatch.apply(model, **options)
    try:
        yield
    finally:
        accelpatch.remove(model)


def _fallback_summary(report) -> str | None:
    reasons = dict(report.fallback_calls)
    for site in report.sites:
        if not site.mounted and site.reason:
            reasons.setdefault(f"not mounted: {site.reason}", 0)
    if not reasons:
        return None
    return "; ".join(f"{reason} ({count})" if count else reason for reason, count in reasons.items())


def fast_path_counts(report, calls: int, tier: str) -> dict[str, Any]:
    """What the fast paths did over ``calls`` forwards at ``tier``: fast calls per forward of the sites of that tier
    (``lossless_calls``: those of the lossless fused sites, which also run under ``high``), fallbacks, mean exact
    fraction. Only the timed tier's own sites count as its fast path: a high row whose high path fell back must not
    show the lossless sites' calls as its fast calls."""
    fractions = [site.stats["exact_fraction"] for site in report.sites if "exact_fraction" in site.stats]
    per_forward = lambda t: sum(s.fast_calls for s in report.sites if s.tier == t) / max(1, calls)  # noqa: E731
    counts: dict[str, Any] = {"fast_calls": per_forward(tier)}
    if tier != "lossless" and per_forward("lossless"):
        counts["lossless_calls"] = per_forward("lossless")
    if fractions:
        counts["exact_fraction"] = sum(fractions) / len(fractions)
    fallbacks = _fallback_summary(report)
    if fallbacks:
        counts["fallbacks"] = fallbacks
    return counts


def timed_at_tier(model: torch.nn.Module, tier: str, fn: Callable[[], Any], repeats: int,
                  device: str) -> tuple[Timing, dict[str, Any]]:
    """Time ``fn`` under ``accelpatch.quality(tier)`` on a patched ``model``; the timing and the fast-path counts
    of exactly those calls."""
    accelpatch.report(model, reset=True)
    with accelpatch.quality(tier):
        timing = timed(fn, repeats, device)
    return timing, fast_path_counts(accelpatch.report(model), timing.calls, tier)


def capture_call(module: torch.nn.Module, run: Callable[[], Any]) -> tuple[tuple, dict]:
    """The positional and keyword arguments of ``module``'s first call while ``run()`` runs: the real inputs of
    one site inside a whole-model forward."""
    captured: list[tuple[tuple, dict]] = []

    def hook(_module, args, kwargs):
        if not captured:
            captured.append((args, dict(kwargs)))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError(f"{type(module).__name__} was not called by the forward")
    return captured[0]

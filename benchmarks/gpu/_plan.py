"""The dry run: every section's GPU-size models and inputs built on the meta device, and the time plan checked.

``--dry-run`` must finish in seconds and still catch what would cost the GPU run its evidence: a config keyword
the model class does not take, a random draw whose generator lives on another device than the tensor it fills
(CUDA refuses that; CPU and meta do not), a budget plan longer than the run's limit. So each section's
``builds(ctx)`` runs with ``device="meta"`` standing for ``"cuda"`` (no memory, no kernels, no compile), under
:class:`DeviceCheck`, which refuses mismatched generators as CUDA would.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.overrides import TorchFunctionMode

from _runner import Context, Options, Section

#: the whole GPU run, compile and Triton JIT warm-up included, must fit this (issue #31: one 8-minute command)
PLAN_LIMIT_S = 480.0
#: one-off costs outside any section's budget: CUDA context, the fused kernels' build, imports
STARTUP_S = 20.0


class DeviceCheck(TorchFunctionMode):
    """Raise as CUDA does when a random draw's ``generator`` is on another device type than the tensor it fills
    ("Expected a 'cuda' device type for generator"); CPU and meta tensors accept any generator silently, so without
    this a CPU rehearsal cannot see that mistake."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        generator = kwargs.get("generator")
        if isinstance(generator, torch.Generator) and isinstance(out, torch.Tensor):
            target = out.device.type
            if target != generator.device.type:
                raise RuntimeError(f"Expected a '{'cuda' if target == 'meta' else target}' device type for "
                                   f"generator but found '{generator.device.type}' ({getattr(func, '__name__', func)} "
                                   f"filling a {target} tensor; meta stands for cuda in the dry run)")
        return out


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def describe_build(built: Any) -> dict[str, Any]:
    """One plan row: parameters of the models built, shapes of the input tensors, and whether all sit on meta."""
    items = built if isinstance(built, (list, tuple)) else (built,)
    models = [item for item in items if isinstance(item, torch.nn.Module)]
    params = [p for model in models for p in model.parameters()]
    inputs = [t for item in items if not isinstance(item, torch.nn.Module) for t in _tensors(item)]
    devices = {t.device.type for t in [*params, *inputs]}
    return {"model": ", ".join(type(m).__name__ for m in models) or "-",
            "params_b": sum(p.numel() for p in params) / 1e9,
            "weights_gib": sum(p.numel() * p.element_size() for p in params) / 2 ** 30,
            "inputs": "; ".join("x".join(map(str, t.shape)) for t in inputs[:4]) + (" …" if len(inputs) > 4 else ""),
            "devices": ",".join(sorted(devices)) or "-"}


def plan_section(section: Section, options: Options, *, starts_at: float) -> dict:
    """A section's dry-run entry: each of its builds at GPU size on meta under :class:`DeviceCheck` (one row each;
    an error makes the section "error"), its budget and hard limit, and where it would start in the run."""
    ctx = Context(section.name, options, budget_s=section.budget_s)
    result: dict[str, Any] = {"status": "ok", "summary": section.summary, "budget_s": section.budget_s,
                              "starts_at_s": starts_at}
    try:
        if section.builds is None:
            raise RuntimeError("the section names no builds (Section.builds): the dry run cannot check it")
        with DeviceCheck():
            for label, build in section.builds(ctx):
                row = {"build": label, **describe_build(build())}
                if row["devices"] not in ("meta", "-"):
                    raise RuntimeError(f"{label}: built on {row['devices']}, not on the run's device (meta here)")
                ctx.add(**row)
    except Exception as error:  # noqa: BLE001 - recorded: the dry run checks every section
        result.update(status="error", error=f"{type(error).__name__}: {error}")
        ctx.log(f"ERROR {result['error']}")
    if result["status"] == "ok" and not ctx.rows:
        result.update(status="error", error="the section builds nothing")
    result.update(seconds=round(ctx.elapsed(), 3), rows=ctx.rows)
    return result


def plan_check(sections: Iterable[Section], time_limit_s: float) -> list[str]:
    """What is wrong with the time plan: budgets plus start-up past the run's limit or past 8 minutes."""
    total = STARTUP_S + sum(section.budget_s for section in sections)
    problems = []
    if time_limit_s > PLAN_LIMIT_S:
        problems.append(f"--time-limit {time_limit_s:g} s is past the {PLAN_LIMIT_S:g} s the GPU run may take")
    if total > min(time_limit_s, PLAN_LIMIT_S):
        problems.append(f"the budgets plus {STARTUP_S:g} s start-up add up to {total:g} s, past the limit of "
                        f"{min(time_limit_s, PLAN_LIMIT_S):g} s")
    return problems


def meta_options(options: Options) -> Options:
    """The GPU run's options with meta for cuda: GPU shapes (not the CPU rehearsal's tiny ones), no memory."""
    return Options(dry_run=False, device="meta", repeats=options.repeats, taus=options.taus,
                   kv_splits=options.kv_splits)


def timed_plan(sections: Iterable[Section], options: Options) -> dict[str, dict]:
    """Every section planned in order, each starting where the budgets before it end."""
    results, starts_at = {}, STARTUP_S
    for section in sections:
        results[section.name] = plan_section(section, meta_options(options), starts_at=starts_at)
        starts_at += section.budget_s
    return results

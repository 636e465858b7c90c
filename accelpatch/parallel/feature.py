"""Parallelism as a feature of the core (:mod:`accelpatch.core.features`): at ``apply()``, a model split before it
is refused and the family's context-parallel plan and split-aware layers are put in place; before each forward, the
ranks are checked to agree (:class:`~.lifecycle.ParallelGuard`); ``remove()`` undoes parallelism enabled after
``apply()`` and CFG parallelism; the report says how the calls were split."""
from __future__ import annotations

import functools
from typing import Any, Optional

from accelpatch.core.features import Feature, register
from accelpatch.parallel.cfg import cfg_parallel_of, disable_cfg_parallel
from accelpatch.parallel.lifecycle import FEATURE, ParallelGuard, refuse_repatching_split_model, refuse_split_model
from accelpatch.parallel.sequence import sequence_shards


class Parallelism(Feature):
    name = FEATURE
    order = 20
    report_field = "parallel"

    def resolve(self, value: Any, options: dict) -> Any:
        return None  # on for every model; nothing to ask for (diffusers' enable_parallelism turns it on)

    def validate(self, model, adapter, config, existing, requested) -> None:
        if existing is None:
            refuse_split_model(model, adapter.cp_plan(model))
        elif existing.key() != requested:
            refuse_repatching_split_model(model, existing)

    def attach(self, model, patch, config, pipeline) -> "_Attached":
        # after the model's hooks: the split-aware layers' pre-hooks read the unsplit inputs first
        attached = _Attached(ParallelGuard(model, patch))
        plan = patch.adapter.cp_plan(model)
        if plan is not None and getattr(type(model), "_cp_plan", None) is None:  # diffusers' class has none
            model._cp_plan = plan
            attached.undo.append(functools.partial(_drop_cp_plan, model))
        undo_layers = patch.adapter.prepare_parallel(model)
        if undo_layers is not None:
            attached.undo.append(undo_layers)
        return attached

    def detach(self, model, state: "_Attached") -> None:
        state.guard.remove(model)  # diffusers' split hooks off first, while the gated classes are in place
        while state.undo:
            state.undo.pop()()

    def forget(self, model, *, reapplying: bool) -> None:
        if not reapplying:  # back to one process's model, also where CFG parallelism came without apply()
            disable_cfg_parallel(model)

    def report(self, model, patch, reset: bool) -> Optional[dict]:
        shards, cfg = sequence_shards(getattr(model, "_parallel_config", None)), cfg_parallel_of(model)
        if shards is None and cfg is None:
            return None
        return {"sequence": shards.world if shards is not None else 1,
                "cfg": cfg.counts.read(reset) if cfg is not None else None}

    def report_line(self, section: dict) -> Optional[str]:
        line = f"split over {section['sequence']} ranks by tokens" if section["sequence"] > 1 else ""
        cfg = section["cfg"]
        if cfg is not None:
            whole = ", ".join(f"{r} ×{n}" for r, n in cfg["whole"].items())
            line += ("; " if line else "") + f"CFG parallel: {cfg['split']} calls split" + (
                f", run whole: {whole}" if whole else "")
        return line or None


class _Attached:
    """What parallelism attached to one model: the rank check, and the plan and layers to undo."""

    def __init__(self, guard: ParallelGuard) -> None:
        self.guard = guard
        self.undo: list = []

    def before_forward(self, model, args) -> None:
        self.guard.before_forward(model, args)


def _drop_cp_plan(model) -> None:
    model.__dict__.pop("_cp_plan", None)


FEATURE = register(Parallelism())

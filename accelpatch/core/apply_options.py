"""Where each keyword option of ``apply()`` belongs, for the models being patched: the chosen backend's, the model
family's own (``adapter.options_class``) or a hosted feature's (the step cache's ``cache_*``).

This is the one place that knows every option name valid for a call, so that an unknown one is refused with the
full valid list grouped by where the options belong, and a close match. A backend is named only where a patched
model runs one: its options are listed (with ``backend=...`` to pass) when the call chose no backend.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from accelpatch.core import features
from accelpatch.core.adapter import ModelAdapter
from accelpatch.core.backends import backend_class, backends


@dataclass(frozen=True)
class OptionGroup:
    """Option names with one owner. ``bucket`` says where this call sends them ("backend", "family", or a feature's
    name); None for a backend the call did not choose, whose options need ``use`` first."""

    owner: str
    names: tuple[str, ...]
    bucket: Optional[str]
    use: str = ""

    def describe(self) -> str:
        return f"{self.owner}{f' ({self.use})' if self.use else ''}: {', '.join(self.names) or 'none of its own'}"


@dataclass
class SplitOptions:
    """``apply()``'s keyword options, sorted by owner."""

    backend: dict = field(default_factory=dict)
    family: dict = field(default_factory=dict)
    #: feature name → its options
    features: dict = field(default_factory=dict)

    def add(self, bucket: str, name: str, value: Any) -> None:
        if bucket in ("backend", "family"):
            getattr(self, bucket)[name] = value
        else:
            self.features.setdefault(bucket, {})[name] = value


def option_groups(backend: Any, adapters: Sequence[ModelAdapter]) -> list[OptionGroup]:
    """Every option owner of a call with ``backend`` on models of these ``adapters``, in the order a name shared by
    two owners is given to. Raises ValueError for a backend that is unknown or that a patched model cannot run."""
    chosen = backend_class(backend)
    families = list({adapter.family: adapter for adapter in adapters}.values())
    groups = []
    if chosen is not None:
        for adapter in families:
            reason = adapter.backend_unavailable_reason(chosen.name)
            if reason is not None:
                raise ValueError(reason)
        given = f"set inside the {chosen.__name__} given" if isinstance(backend, chosen) else ""
        groups.append(OptionGroup(f"backend {chosen.name!r}", tuple(chosen.option_names()), "backend", given))
    groups += [OptionGroup(adapter.family, tuple(adapter.option_names()), "family") for adapter in families]
    groups += [OptionGroup(f.owner or f.name, f.option_names(), f.name, f.use) for f in features.registered()
               if f.option_names()]
    runnable = {name for adapter in families for name in adapter.backends}
    groups += [OptionGroup(f"backend {name!r}", tuple(cls.option_names()), None, f"with backend={name!r}")
               for name, cls in backends().items() if name in runnable and cls is not chosen]
    return groups


def split_options(options: dict, backend: Any, adapters: Sequence[ModelAdapter],
                  models: Sequence[Any] = ()) -> SplitOptions:
    """Sort ``options`` by owner (see :func:`option_groups`); raise ValueError naming every option that has no
    owner in this call, with the valid ones grouped by owner and a close match. ``models`` name the patched
    classes in the message."""
    groups = option_groups(backend, adapters)
    split = SplitOptions()
    unknown = []
    for name, value in options.items():
        group = next((g for g in groups if name in g.names), None)
        if group is None or group.bucket is None:
            unknown.append(name)
        else:
            split.add(group.bucket, name, value)
    if unknown:
        raise ValueError(_unknown_message(sorted(unknown), groups, adapters, models))
    return split


def _unknown_message(unknown: list[str], groups: list[OptionGroup], adapters: Sequence[ModelAdapter],
                     models: Sequence[Any]) -> str:
    families = {adapter.family for adapter in adapters}
    notes = []
    for name in unknown:
        owner = next((g for g in groups if name in g.names), None)
        if owner is not None:  # a backend the call did not choose
            notes.append(f"{name!r} is an option of {owner.owner}: pass it {owner.use}")
            continue
        others = [a.family for a in features.adapters() if a.family not in families and name in a.option_names()]
        if others:
            notes.append(f"{name!r} is an option of {' and '.join(others)} models, not of "
                         f"{' or '.join(sorted(families))}")
            continue
        every = {n: g for g in reversed(groups) for n in g.names}
        close = difflib.get_close_matches(name, list(every), n=1)
        if close:
            group = every[close[0]]
            where = f" ({group.owner}, {group.use})" if group.bucket is None else ""
            notes.append(f"did you mean {name!r} → {close[0]!r}{where}?")
    classes = ", ".join(sorted({type(m).__name__ for m in models})) or "this model"
    return (f"apply() got unknown option(s) {unknown} for {classes}" + (f" ({'; '.join(notes)})" if notes else "")
            + f"; valid options for this call: {'; '.join(g.describe() for g in groups)}")

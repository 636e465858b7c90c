"""Stand-ins a fake trace calls instead of a diffusers function that loops over values the trace does not have.

Why: HunyuanVideo 1.5's VAE builds its frame-causal attention mask with a Python loop over every latent token, each
turn an in-place write: on fake tensors that is hundreds of thousands of operators (minutes) that change no byte of
the plan. A family names such a function and its stand-in (:class:`~accelpatch.models.families.VaeDecodeCase`); while
:func:`standing_in` is active the class attribute is replaced by a wrapper that calls the stand-in only under a fake
mode and diffusers' own function otherwise, so a real run at the same moment is unchanged. The function must be the
code its fingerprint was recorded for (:mod:`accelpatch.core.restated`): a changed one is traced as it is, slowly,
and the reason is returned.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from typing import Iterator, Sequence

from accelpatch.core.restated import mismatch, short_name
from accelpatch.core.restated import resolve as resolve_restated


def _owner(qualified: str):
    """(the object holding the function, its attribute name) for ``"module:Class.function"``."""
    module_name, _, attributes = qualified.partition(":")
    path, _, name = attributes.rpartition(".")
    return (resolve_restated(f"{module_name}:{path}") if path else importlib.import_module(module_name)), name


@contextlib.contextmanager
def standing_in(stand_ins: Sequence[tuple[str, str]]) -> Iterator[list[str]]:
    """Install each (diffusers function, "module:function") pair for the block; yields the reasons of those left
    out (their diffusers function is not the recorded code)."""
    from torch._guards import detect_fake_mode

    from accelpatch.models.families import resolve

    skipped: list[str] = []
    with contextlib.ExitStack() as stack:
        for qualified, replacement in stand_ins:
            reason = mismatch(qualified)
            if reason is not None:
                skipped.append(f"{short_name(qualified)} traced as it is (slowly): {reason}")
                continue
            owner, name = _owner(qualified)
            static = inspect.getattr_static(owner, name)
            original = getattr(owner, name)
            stand_in = resolve(replacement)

            @functools.wraps(original)
            def wrapper(*args, __original=original, __stand_in=stand_in, **kwargs):
                return (__stand_in if detect_fake_mode() is not None else __original)(*args, **kwargs)

            setattr(owner, name, staticmethod(wrapper) if isinstance(static, staticmethod) else wrapper)
            stack.callback(setattr, owner, name, static)
        yield skipped

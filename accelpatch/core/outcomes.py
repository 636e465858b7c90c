"""The one vocabulary for what happened to a fast path, at ``apply`` and at every call.

Every count and message says one of three things:

* **ran**: the fast path did its fast work (a lossless op fused, a sparse call skipped blocks);
* **declined: <reason>**: it was asked for and could not run (a guard, a kernel error, a mismatch on first sight, a
  site that did not mount): the reference runs instead, the user is warned once, and ``strict=True`` raises;
* **not applicable: <reason>**: by policy it was not asked to run (the tier in force does not admit it, a dense step
  or layer, another dtype or device, another CPU, inside ``torch.compile``): the reference runs, counted, never
  warned about, since nothing went wrong.

A fast path answers a call with its output (it ran), a :class:`Declined` or a :class:`NotApplicable`.
"""
from __future__ import annotations

RAN = "ran"
DECLINED = "declined"
NOT_APPLICABLE = "not applicable"
KINDS = (RAN, DECLINED, NOT_APPLICABLE)


class Outcome:
    """A call a fast path did not run, with the reason (see the module docstring for the two kinds)."""

    __slots__ = ("reason",)
    kind = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r})"

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


class Declined(Outcome):
    """Asked for, could not run: counted as a fallback, warned about once, raised under ``strict=True``."""

    __slots__ = ()
    kind = DECLINED


class NotApplicable(Outcome):
    """Kept on the reference path by policy (a dense step or layer, the tier): counted with its reason, never warned
    about."""

    __slots__ = ()
    kind = NOT_APPLICABLE


def declined(reason: str) -> str:
    """The text of a declined call: ``"declined: <reason>"``."""
    return f"{DECLINED}: {reason}"


def not_applicable(reason: str) -> str:
    """The text of a call kept off a fast path by policy: ``"not applicable: <reason>"``."""
    return f"{NOT_APPLICABLE}: {reason}"


def kind_of(text: str) -> str:
    """Which of :data:`KINDS` an outcome's text says."""
    for kind in (DECLINED, NOT_APPLICABLE):
        if text.startswith(kind + ":"):
            return kind
    if text == RAN:
        return RAN
    raise ValueError(f"{text!r} is not an outcome: one of {RAN!r}, '{DECLINED}: <reason>', "
                     f"'{NOT_APPLICABLE}: <reason>'")

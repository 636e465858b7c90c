"""Exceptions raised by accelpatch."""


class AccelpatchError(RuntimeError):
    """Base class of accelpatch runtime errors."""


class FastPathUnavailableError(AccelpatchError):
    """A requested fast path could not run and the model was patched with ``strict=True``."""


class CacheConflictError(AccelpatchError):
    """accelpatch's step cache and another step cache (cache-dit's, diffusers' own) were put on one model: both
    would skip the same blocks by their own decisions. The message says which to drop."""


def did_you_mean(name: object, choices) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``name``, or "" when none is close: the hint every
    error about a misspelled name gives."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# Errors that must never be swallowed by a fallback: they leave the device in an unknown state.
_FATAL_MARKERS = ("out of memory", "illegal memory access", "device-side assert")


def is_fatal(error: BaseException) -> bool:
    """True for errors that re-raise instead of falling back to the reference path: out of memory, illegal memory
    access, device-side assert (the device state is unknown after them), interrupts and any other ``BaseException``
    that is not an ``Exception`` (a caller's time limit), and the exception
    non-reentrant checkpointing raises to stop a recomputation once it has what backward needs (control flow,
    not trouble: running the reference instead would recompute into a finished frame)."""
    import torch
    import torch.utils.checkpoint as checkpoint

    stop = getattr(checkpoint, "_StopRecomputationError", ())
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit, a caller's alarm: never the kernel's fault
        return True
    if isinstance(error, (torch.cuda.OutOfMemoryError, stop)):
        return True
    text = str(error).lower()
    return any(marker in text for marker in _FATAL_MARKERS)

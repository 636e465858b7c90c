"""Exceptions raised by accelpatch."""


class AccelpatchError(RuntimeError):
    """Base class of accelpatch runtime errors."""


class FastPathUnavailableError(AccelpatchError):
    """A requested fast path could not run and the model was patched with ``strict=True``."""


# Errors that must never be swallowed by a fallback: they leave the device in an unknown state.
_FATAL_MARKERS = ("out of memory", "illegal memory access", "device-side assert")


def is_fatal(error: BaseException) -> bool:
    """True for errors that re-raise instead of falling back to the reference path: out of memory, illegal memory
    access, device-side assert (the device state is unknown after them), and interrupts."""
    import torch

    if isinstance(error, (torch.cuda.OutOfMemoryError, KeyboardInterrupt, SystemExit)):
        return True
    text = str(error).lower()
    return any(marker in text for marker in _FATAL_MARKERS)

"""Exceptions raised by accelpatch."""


class AccelpatchError(RuntimeError):
    """Base class of accelpatch runtime errors."""


class FastPathUnavailableError(AccelpatchError):
    """A requested fast path could not run and the model was patched with ``strict=True``."""

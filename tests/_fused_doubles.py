"""Stand-in CPU kernels of the fused ops for tests of the verification machinery: each op's stand-in is its
reference chain (so it is bit-exact by construction), and ``WRONG`` names ops that return a perturbed result
instead. ``substituted()`` puts them in place of every registered op's CPU kernel (``FusedOp.substituted``)."""
from __future__ import annotations

import contextlib

import accelpatch.lossless.ops  # noqa: F401 - registers the package's ops
from accelpatch.lossless.kernels.library import Kernel, KernelLibrary
from accelpatch.lossless.verify import FusedOp, ops

CALLS: dict[str, int] = {}
WRONG: set[str] = set()
UNSUPPORTED: dict[str, str] = {}


def unsupported(op: str, *args):
    return UNSUPPORTED.get(op)


#: a library that shares no checks and is always available (the stand-ins need no build)
LIBRARY = KernelLibrary("cpu", "CPU", lambda name, check, args: check(*args))


def _make(op: FusedOp) -> Kernel:
    name, fn = op.name, op.reference

    def run(*args):
        CALLS[name] = CALLS.get(name, 0) + 1
        out = fn(*args)
        if name in WRONG:
            outs = out if isinstance(out, tuple) else (out,)
            bad = outs[-1].clone()
            bad[(0,) * bad.dim()] += 1.0
            out = outs[:-1] + (bad,) if isinstance(out, tuple) else bad
        return out

    run.__name__ = name
    return Kernel(name, LIBRARY, run, lambda *args: unsupported(name, *args))  # read late: tests patch it


@contextlib.contextmanager
def substituted():
    """Every registered op's CPU kernel replaced by its stand-in inside the block."""
    with contextlib.ExitStack() as stack:
        for op in ops().values():
            stack.enter_context(op.substituted(_make(op)))
        yield

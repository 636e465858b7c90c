"""Stand-in implementations of the fused ops for tests of the verification machinery: each op is its reference
chain (so it is bit-exact by construction), and ``WRONG`` names ops that return a perturbed result instead."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import reference

CALLS: dict[str, int] = {}
WRONG: set[str] = set()
UNSUPPORTED: dict[str, str] = {}


def unsupported(op: str, *args):
    return UNSUPPORTED.get(op)


def _make(name):
    fn = getattr(reference, name)

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
    return run


for _name in ("relu_rope_pair", "rope_pair", "modulate", "gated_residual", "silu", "glu_gate", "scale_to_tokens",
              "rotate_half_pair", "rotary_complex_pair", "sigmoid_gate", "rope_pair_per_channel", "rope_split_pair",
              "pointwise_conv", "linear"):
    globals()[_name] = _make(_name)

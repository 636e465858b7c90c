"""The lossless fused ops the models' fast paths call, one module per op: its reference chain, its
:class:`~accelpatch.lossless.verify.FusedOp` (registered by name for pickles) and its kernels, registered on the op
with the ``kernel`` decorator. Each op runs fused only for call signatures where its kernel matched the reference
bit for bit on first sight (:mod:`accelpatch.lossless.verify`).

The ops know no model; the adapters' restated forwards say where each chain sits in their model. Importing this
package registers every op; no kernel is built and Triton is not imported until a kernel first runs.
"""
from __future__ import annotations

from accelpatch.lossless.ops.gated_residual import GATED_RESIDUAL
from accelpatch.lossless.ops.gelu_inplace import GELU_INPLACE
from accelpatch.lossless.ops.glu_gate import GLU_GATE
from accelpatch.lossless.ops.modulate import MODULATE
from accelpatch.lossless.ops.relu_rope_pair import RELU_ROPE_PAIR
from accelpatch.lossless.ops.rope_pair import ROPE_PAIR
from accelpatch.lossless.ops.rope_pair_per_channel import ROPE_PAIR_PER_CHANNEL
from accelpatch.lossless.ops.rope_split_pair import SPLIT_ROPE_PAIR
from accelpatch.lossless.ops.rotary_complex_pair import ROTARY_COMPLEX_PAIR
from accelpatch.lossless.ops.rotate_half_pair import ROTATE_HALF_PAIR
from accelpatch.lossless.ops.scale_to_tokens import SCALE_TO_TOKENS
from accelpatch.lossless.ops.sigmoid_gate import SIGMOID_GATE
from accelpatch.lossless.ops.silu import SILU, SILU_INPLACE

__all__ = ["GATED_RESIDUAL", "GELU_INPLACE", "GLU_GATE", "MODULATE", "RELU_ROPE_PAIR", "ROPE_PAIR", "ROPE_PAIR_PER_CHANNEL",
           "ROTARY_COMPLEX_PAIR", "ROTATE_HALF_PAIR", "SCALE_TO_TOKENS", "SIGMOID_GATE", "SILU", "SILU_INPLACE",
           "SPLIT_ROPE_PAIR"]

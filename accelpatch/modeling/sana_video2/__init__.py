"""SANA-Video 2.0 as diffusers components: the transformer (and, alongside, its checkpoint converter and
pipeline). Importing this imports diffusers."""
from .attention import (SanaVideo2CrossAttention, SanaVideo2LinearAttention, SanaVideo2LinearAttnProcessor,
                        SanaVideo2SoftmaxAttention, SanaVideo2SoftmaxAttnProcessor)
from .transformer import SanaVideo2Transformer3DModel, anchor_layer_indices

__all__ = [
    "SanaVideo2Transformer3DModel", "anchor_layer_indices", "SanaVideo2SoftmaxAttention", "SanaVideo2LinearAttention",
    "SanaVideo2SoftmaxAttnProcessor", "SanaVideo2LinearAttnProcessor", "SanaVideo2CrossAttention",
]

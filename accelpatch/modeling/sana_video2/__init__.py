"""SANA-Video 2.0 as diffusers components: the transformer (and, alongside, its checkpoint converter and
pipeline). Importing this imports diffusers."""
from .attention import (SanaVideo2CrossAttention, SanaVideo2LinearAttention, SanaVideo2LinearAttnProcessor,
                        SanaVideo2SoftmaxAttention, SanaVideo2SoftmaxAttnProcessor)
from .transformer import SanaVideo2Transformer3DModel, anchor_layer_indices

__all__ = [
    "SanaVideo2Transformer3DModel", "anchor_layer_indices", "SanaVideo2SoftmaxAttention", "SanaVideo2LinearAttention",
    "SanaVideo2SoftmaxAttnProcessor", "SanaVideo2LinearAttnProcessor", "SanaVideo2CrossAttention",
    "SanaVideo2Pipeline", "SanaVideo2PipelineOutput",
]


def __getattr__(name: str):
    # The pipeline imports transformers and more diffusers (about a second): only when asked for.
    if name in ("SanaVideo2Pipeline", "SanaVideo2PipelineOutput"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

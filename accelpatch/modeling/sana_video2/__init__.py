"""SANA-Video 2.0 as diffusers components: the transformer, its pipeline and its checkpoint converter.

Importing this imports diffusers and transformers, and is all ``diffusers.DiffusionPipeline.from_pretrained`` needs
to load a saved ``SanaVideo2Pipeline`` folder: diffusers resolves the folder's class names only among the modules
already imported and the ``diffusers`` namespace, which the pipeline module extends (see its docstring).
"""
from ..sana_video2_release import anchor_layer_indices
from .attention import (SanaVideo2CrossAttention, SanaVideo2LinearAttention, SanaVideo2LinearAttnProcessor,
                        SanaVideo2SoftmaxAttention, SanaVideo2SoftmaxAttnProcessor)
from .pipeline import SanaVideo2Pipeline, SanaVideo2PipelineOutput
from .transformer import SanaVideo2Transformer3DModel

__all__ = [
    "SanaVideo2Transformer3DModel", "anchor_layer_indices", "SanaVideo2SoftmaxAttention", "SanaVideo2LinearAttention",
    "SanaVideo2SoftmaxAttnProcessor", "SanaVideo2LinearAttnProcessor", "SanaVideo2CrossAttention",
    "SanaVideo2Pipeline", "SanaVideo2PipelineOutput",
]

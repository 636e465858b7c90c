"""SANA-Video 2.0 as diffusers components: the transformer (and, alongside, its checkpoint converter and
pipeline). Importing this imports diffusers, not the pipeline (which pulls transformers and much more of diffusers:
about a second, and more than that on a cold start). Importing it also makes ``SanaVideo2Pipeline`` a lazy name of
the ``diffusers`` namespace, where ``diffusers.DiffusionPipeline.from_pretrained`` looks up a saved folder's
``_class_name``: this import is all that such a load needs. It also imports the 4-step scheduler
(``SanaVideo2FewStepScheduler``, light: diffusers' scheduler base only), which a saved pipeline folder records under
its module path; diffusers resolves that path from the modules already imported, so the same import covers it.
"""
from accelpatch.core.diffusers_namespace import offer_to_diffusers
from accelpatch.models.sana_video2.release import anchor_layer_indices
from accelpatch.models.sana_video2.modeling.attention import (SanaVideo2CrossAttention, SanaVideo2LinearAttention, SanaVideo2LinearAttnProcessor,
                        SanaVideo2SoftmaxAttention, SanaVideo2SoftmaxAttnProcessor)
from accelpatch.models.sana_video2.modeling.few_step import SanaVideo2FewStepScheduler, SanaVideo2FewStepSchedulerOutput
from accelpatch.models.sana_video2.modeling.transformer import SanaVideo2Transformer3DModel

__all__ = [
    "SanaVideo2Transformer3DModel", "anchor_layer_indices", "SanaVideo2SoftmaxAttention", "SanaVideo2LinearAttention",
    "SanaVideo2SoftmaxAttnProcessor", "SanaVideo2LinearAttnProcessor", "SanaVideo2CrossAttention",
    "SanaVideo2Pipeline", "SanaVideo2PipelineOutput", "SanaVideo2FewStepScheduler", "SanaVideo2FewStepSchedulerOutput",
]

_PIPELINE_NAMES = ("SanaVideo2Pipeline", "SanaVideo2PipelineOutput")


def __getattr__(name: str):
    if name in _PIPELINE_NAMES:  # imported on first use (see the module docstring)
        from accelpatch.models.sana_video2.modeling import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


offer_to_diffusers("SanaVideo2Pipeline", "accelpatch.models.sana_video2.modeling.pipeline:SanaVideo2Pipeline")

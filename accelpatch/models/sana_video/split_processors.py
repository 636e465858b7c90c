"""The two attention processors ``apply`` swaps into every SANA-Video block, for diffusers' context parallelism.

- ``attn1``: :class:`SplitLinearAttnProcessor`, diffusers' ``SanaLinearAttnProcessor3_0`` that also knows the
  sequence split. Unsplit, it *is* diffusers' processor (``super().__call__``, bit for bit). Split, it runs the
  restatement of :mod:`.restated_attention` with the eager reference chains and the two token sums all-reduced: the
  exact tier's linear attention would otherwise stay silently local, as diffusers' processor never reaches its
  attention dispatcher.
- ``attn2``: :class:`LocalCrossAttnProcessor`, diffusers' ``SanaAttnProcessor2_0`` that never sees a parallel
  config. Text is replicated on every rank, so cross-attention is local; diffusers' Ulysses on it fails with the text
  mask (the mask keeps all heads while q carries H/P) and without it all-to-alls replicated text for nothing.

How the split is known: diffusers' ``enable_parallelism`` records its ``ParallelConfig`` on every processor that has
a ``_parallel_config`` attribute (the attn1 processor's class attribute is there for that); the SANA-Video layers
read the split from there (:func:`accelpatch.parallel.sequence.processor_shards`; at world size 1, where diffusers'
``ContextParallelConfig`` refuses a degree of 1, :func:`.sequence_parallel.one_process_split` records it). Imports diffusers: loaded at ``apply`` (and by unpickling), never by
``import accelpatch``.
"""
from __future__ import annotations

from typing import Optional

from diffusers.models.transformers.transformer_sana_video import SanaAttnProcessor2_0, SanaLinearAttnProcessor3_0

from accelpatch.parallel.sequence import SequenceShards, processor_shards

class SplitLinearAttnProcessor(SanaLinearAttnProcessor3_0):
    """diffusers' SANA linear-attention processor, split-aware: see the module docstring."""

    #: set by diffusers' ``enable_parallelism`` on the instance (it sets the attribute where a processor has one)
    _parallel_config = None

    def sequence_shards(self) -> Optional[SequenceShards]:
        return processor_shards(self)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        shards = self.sequence_shards()
        if shards is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        if encoder_hidden_states is not None or rotary_emb is None:
            raise ValueError("SANA-Video's split linear attention covers self-attention with rotary_emb, as "
                             "SanaVideoTransformerBlock calls it; got "
                             + ("encoder_hidden_states" if encoder_hidden_states is not None else "no rotary_emb"))
        from accelpatch.models.sana_video.restated_attention import linear_attention

        return linear_attention(attn, None, hidden_states, rotary_emb, bf16_first_gemm=False, shards=shards)


class LocalCrossAttnProcessor(SanaAttnProcessor2_0):
    """diffusers' SANA cross-attention processor, always local: its ``_parallel_config`` reads None, and what
    ``enable_parallelism`` assigns to it is dropped."""

    @property
    def _parallel_config(self):
        return None

    @_parallel_config.setter
    def _parallel_config(self, value) -> None:
        pass

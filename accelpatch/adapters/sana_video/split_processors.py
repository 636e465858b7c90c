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
read the split from there (:func:`processor_shards`), or from :func:`forced_split` at world size 1, where diffusers'
``ContextParallelConfig`` refuses a degree of 1. Imports diffusers: loaded at ``apply`` (and by unpickling), never by
``import accelpatch``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from diffusers.models.transformers.transformer_sana_video import SanaAttnProcessor2_0, SanaLinearAttnProcessor3_0

from ...parallel.sequence import SequenceShards, sequence_shards

#: the split :func:`forced_split` puts in force (process-wide: a plain global, which compiled code can read)
_forced: Optional[SequenceShards] = None


@contextlib.contextmanager
def forced_split(shards: SequenceShards) -> Iterator[None]:
    """Run every patched SANA-Video model of this process as split over ``shards`` without diffusers' config, for the
    duration of the block: the entry for world size 1 (``shards_of_group()`` of a one-process group), where the split
    layers must change no bit. Larger worlds go through ``enable_parallelism``, whose hooks split the inputs."""
    global _forced
    if shards.world != 1:
        raise ValueError(f"forced_split is for a world size of 1 (got {shards.world}); split over several ranks "
                         "with transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=N))")
    previous, _forced = _forced, shards
    try:
        yield
    finally:
        _forced = previous


def split_of(parallel_config: Any) -> Optional[SequenceShards]:
    """The split in force for a layer whose recorded config is ``parallel_config``: the forced one, else the config's
    sequence group (None: not split)."""
    return _forced if _forced is not None else sequence_shards(parallel_config)


def processor_shards(processor: Any) -> Optional[SequenceShards]:
    """The split ``processor`` sees (None for any processor but :class:`SplitLinearAttnProcessor`)."""
    return processor.sequence_shards() if isinstance(processor, SplitLinearAttnProcessor) else None


class SplitLinearAttnProcessor(SanaLinearAttnProcessor3_0):
    """diffusers' SANA linear-attention processor, split-aware: see the module docstring."""

    #: set by diffusers' ``enable_parallelism`` on the instance (it sets the attribute where a processor has one)
    _parallel_config = None

    def sequence_shards(self) -> Optional[SequenceShards]:
        return split_of(self._parallel_config)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        shards = self.sequence_shards()
        if shards is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        if encoder_hidden_states is not None or rotary_emb is None:
            raise ValueError("SANA-Video's split linear attention covers self-attention with rotary_emb, as "
                             "SanaVideoTransformerBlock calls it; got "
                             + ("encoder_hidden_states" if encoder_hidden_states is not None else "no rotary_emb"))
        from .restated_attention import linear_attention

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

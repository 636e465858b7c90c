"""What every model adapter running the ``sol_attn`` backend shares: the model's default dense layers, the checks
of ``dense_layers`` against the model's block list, and the step policy. The sites themselves are the family's
``sites`` table (:class:`~accelpatch.core.adapter.SiteRule` rows, the backend's with ``backend="sol_attn"``).

A next model sets ``family``, ``model_classes``, ``sites``, ``block_list`` and, where diffusers' layout may drift,
:meth:`SolAttnAdapter.layout_mismatch` (checked at ``apply`` before anything is touched).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from accelpatch.core.adapter import ModelAdapter
from accelpatch.core.steps import from_end, step_count
from accelpatch.sol_attn.config import all_layers_dense_reason


class SolAttnAdapter(ModelAdapter):
    """A :class:`~accelpatch.core.adapter.ModelAdapter` for a model whose attention is one Sol-Attn site per block.
    Its own extension points: ``block_list``, ``block_noun``, ``default_dense_layers`` and :meth:`layout_mismatch`."""

    EXTENSION_POINTS = ModelAdapter.EXTENSION_POINTS + ("block_list", "block_noun", "default_dense_layers",
                                                        "layout_mismatch")
    backends = ("sol_attn",)
    #: the model's ModuleList of transformer blocks (layer i is ``<block_list>.i``), and what the report calls them
    block_list: str = "blocks"
    block_noun: str = "transformer blocks"
    #: the model's dense layers when ``dense_layers`` is left to it (None): SGLang's policy default (sol_attn.md §3),
    #: which every adapter so far keeps (its docstring says how far it is measured on that model)
    default_dense_layers: frozenset = frozenset({0, 1})

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Why ``model``'s layout is not the one this adapter knows (None when it is): checked at ``apply``."""
        return None

    def num_layers(self, model: torch.nn.Module) -> int:
        return len(getattr(model, self.block_list))

    def complete_backend(self, backend_config: Any, model: torch.nn.Module) -> Any:
        if backend_config is not None and backend_config.dense_layers is None:
            return dataclasses.replace(backend_config, dense_layers=self.default_dense_layers)
        return backend_config

    def validate_backend(self, backend_config: Any, model: torch.nn.Module) -> None:
        super().validate_backend(backend_config, model)
        if backend_config is None:
            return
        mismatch = self.layout_mismatch(model)
        if mismatch is not None:
            raise ValueError(f"accelpatch knows {type(model).__name__}'s layout of diffusers 0.42, and this model "
                             f"differs: {mismatch}; sol_attn is not applied (nothing was touched)")
        layers = self.num_layers(model)
        missing = sorted(i for i in backend_config.dense_layers if i >= layers)
        if missing:
            raise ValueError(f"dense_layers names layer(s) {missing} that {type(model).__name__} does not have: it "
                             f"has {layers} {self.block_noun}, valid layer indices are 0-{layers - 1}")

    def static_noops(self, model: torch.nn.Module, backend_config: Any, options: Any,
                     asked: Any = None) -> list[str]:
        if backend_config is None:
            return []
        reason = all_layers_dense_reason(backend_config, range(self.num_layers(model)), type(model).__name__,
                                         what=self.block_noun, defaulted=asked.dense_layers is None)
        return [reason] if reason is not None else []

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple:
        if backend_config is None:
            return ()
        return step_count(backend_config.dense_steps), from_end(backend_config.dense_last_steps)

"""What every model adapter running the ``sol_attn`` backend shares: the model's default dense layers, the checks
of ``dense_layers`` against the model's block list, the step policy, and (for models whose attention is one
:class:`~accelpatch.sol_attn.sites.DispatchSelfAttention` per block plus always-dense cross-attention) the
sites themselves, found by module-path patterns: the lossless fusions' (any backend) and the backend's.

A next model sets ``family``, ``model_classes``, ``block_list``, ``default_dense_layers``, the two patterns and the
two fast paths, its ``lossless_sites``, and, where diffusers' layout may drift, :meth:`SolAttnAdapter.layout_mismatch`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, Optional

import torch

from accelpatch.sol_attn.config import all_layers_dense_reason
from accelpatch.core.sites import FastPath
from accelpatch.core.tiers import DEFAULT_TIER, Tier
from accelpatch.core.adapter import ModelAdapter


class SolAttnAdapter(ModelAdapter):
    backends = ("sol_attn",)
    #: the model's ModuleList of transformer blocks (layer i is ``<block_list>.i``), and what the report calls them
    block_list: str = "blocks"
    block_noun: str = "transformer blocks"
    #: the model's dense layers when ``dense_layers`` is left to it (None): SGLang's policy default (sol_attn.md §3),
    #: which every adapter so far keeps (its docstring says how far it is measured on that model)
    default_dense_layers: frozenset = frozenset({0, 1})
    #: module paths (fullmatch, group 1 the layer index) of the Sol-Attn sites and of the always-dense ones
    sol_sites: Optional[re.Pattern] = None
    dense_sites: Optional[re.Pattern] = None
    sol_path: Optional[FastPath] = None
    dense_path: Optional[FastPath] = None
    #: (pattern, fast path) of the lossless fusions, mounted with or without a backend, before the backend's sites
    lossless_sites: tuple = ()

    def default_tier(self, backend_config: Any) -> Tier:
        return Tier.HIGH if backend_config is not None else DEFAULT_TIER

    def num_layers(self, model: torch.nn.Module) -> int:
        return len(getattr(model, self.block_list))

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Why ``model``'s layout is not the one this adapter knows (None when it is): checked at ``apply``."""
        return None

    def backend_sites(self) -> tuple:
        """(pattern, fast path) of the sites ``sol_attn`` adds: the Sol-Attn ones and the always-dense ones."""
        return (self.sol_sites, self.sol_path), (self.dense_sites, self.dense_path)

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple]:
        """Every module matching :attr:`lossless_sites`, then (with a backend) :meth:`backend_sites`: (path,
        module, fast path, layer index)."""
        yield from _matching(model, self.lossless_sites)
        if backend_config is not None:
            yield from _matching(model, self.backend_sites())

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

    def uses_steps(self, backend_config: Any, options: Any = None) -> bool:
        return backend_config is not None and backend_config.dense_steps > 0

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple[int, ...]:
        return (backend_config.dense_steps,) if backend_config is not None else ()


def _matching(model: torch.nn.Module, table) -> Iterator[tuple]:
    for path, module in model.named_modules():
        for pattern, fast_path in table:
            match = pattern.fullmatch(path) if pattern is not None else None
            if match is not None:
                yield path, module, fast_path, int(match.group(1))

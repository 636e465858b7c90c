"""``apply(pipe, memory="low")``: the opt-in lower-memory mode as a feature of the core (issue #44 part 3).

Its sites are rows of each family's site table marked ``feature="memory"`` (:mod:`accelpatch.low_memory.chunked`: the
feed-forwards and the query/key norms run in chunks of tokens); they mount only when this feature is on, so a model
patched without it carries none of them. ``memory_chunk_tokens`` sets the chunk (tokens of each video per chunk).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

from accelpatch.core.features import Feature, register

#: the modes ``memory=`` takes ("default": as without the argument)
MODES = ("default", "low")
#: tokens of each video per chunk: at 720p Wan's 75,600 tokens run in ten chunks; a GPU's GEMM on 8,192 rows is as
#: efficient as on all of them (a chunk is thousands of tiles), while the feed-forward's hidden state held at once
#: shrinks ninefold
DEFAULT_CHUNK_TOKENS = 8192


@dataclass(frozen=True)
class MemoryMode:
    """The lower-memory mode of one ``apply()`` call (hashable: part of the patch's key)."""

    level: str = "low"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS

    def describe(self) -> str:
        return f"memory={self.level!r}, chunks of {self.chunk_tokens:,} tokens"


class LowMemory(Feature):
    name = "memory"
    order = 5
    argument = "memory"
    default = None
    owner = "memory='low'"
    use = "with memory='low'"

    def option_names(self) -> tuple[str, ...]:
        return ("memory_chunk_tokens",)

    def resolve(self, value: Any, options: dict) -> Optional[MemoryMode]:
        chunk = options.get("memory_chunk_tokens")
        if isinstance(value, MemoryMode):
            return value if chunk is None else MemoryMode(value.level, _chunk(chunk))
        if value is None or value == "default":
            if chunk is not None:
                raise ValueError(f"memory_chunk_tokens={chunk!r} needs memory='low' (got memory={value!r})")
            return None
        if value != "low":
            raise ValueError(f"memory must be one of {', '.join(map(repr, MODES))} or None, got {value!r}")
        return MemoryMode("low", DEFAULT_CHUNK_TOKENS if chunk is None else _chunk(chunk))

    def attach(self, model: Any, patch: Any, config: Any, pipeline: Any) -> None:
        """Never a silent no-op: a model none of whose fast paths chunks (none lists the chunked op) says so
        (strict raises)."""
        if config is None:
            return None
        if any(getattr(op, "feature", None) == self.name for site in patch.sites for op in site.fast_path.fused_ops):
            return None  # a path runs the chunked op (accelpatch.low_memory.chunked.CHUNKED: its feature is this)
        message = (f"memory='low' does nothing on {patch.model_class} yet: none of its patched modules "
                   f"({patch.adapter.family}) runs a chunked computation; it runs as at the default tier")
        if patch.strict:
            from accelpatch.core.errors import FastPathUnavailableError

            raise FastPathUnavailableError(f"{message} (strict=True refuses a fast path that can never run)")
        warnings.warn(f"accelpatch: {message}", RuntimeWarning, stacklevel=4)
        return None

    def offers_high(self, config: Any) -> bool:
        return config is not None  # at tier high the chunks run without their first-sight check


def _chunk(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"memory_chunk_tokens must be an integer >= 1 (tokens of each video per chunk; default "
                         f"{DEFAULT_CHUNK_TOKENS:,}), got {value!r}")
    return value


def memory_mode(patch: Any) -> Optional[MemoryMode]:
    """A patched model's lower-memory mode (None: off, or not patched)."""
    configs = getattr(patch, "configs", None)
    return None if configs is None else configs.get(LowMemory.name)


FEATURE = register(LowMemory())

"""The ``sol_attn`` backend's configuration: typed, validated before any module is touched, hashable.

Sparse attention is approximate, so a model patched with this backend runs it at the ``high`` tier (its default
tier becomes ``high``); ``quality("exact")``/``("lossless")`` run the original dense attention. The dense guards
follow the integration policy of the prior art: the first ``dense_steps`` denoising steps, the last
``dense_last_steps``, every layer in ``dense_layers`` and every call over fewer than ``min_tokens`` tokens run the
original processor unchanged. A number of steps is a count or a fraction of the call's steps (``0.2`` or ``"20%"``:
1 of 4 steps, 2 of 10, 10 of 50; :class:`accelpatch.core.steps.StepCount`). ``dense_rows`` says which query rows of a sparse call are
recomputed with dense attention over all keys: ``"text_audio"`` (the default) keeps a packed model's non-video rows
(MiniMax-H3's text and audio) exact, so that only the video query rows are sparse; ``"none"`` leaves every query row
to Sol-Attn.
"""
from __future__ import annotations

import difflib
import functools
import math
import numbers
import re
from dataclasses import dataclass, fields
from typing import Any, Iterable, Optional, Union

from accelpatch.core.steps import normalize_step_count

THRESH_TYPES = ("diag", "exact")
KV_SPLITS = (1, 2, 4)
IMPLS = ("auto", "torch", "triton", "upstream")
#: ``dense_rows`` choices: the model's text/audio query rows dense (only video rows sparse), or no row dense
DENSE_ROWS = ("text_audio", "none")

#: the first 20 % of a call's steps run dense: Sol-Engine's "first 10 of 50" and ComfyUI's ``start_percent=0.2``,
#: in proportion to the call, so a 50-step call keeps 10 dense steps and a 4-step distilled call 1 (rounded up)
DEFAULT_DENSE_STEPS = 0.2
#: attention over fewer tokens runs dense: ComfyUI's sparse-attention floor. Measured here (docs/sol-attn.md,
#: "Short sequences"): on the CPU the PyTorch path already wins at 1,024 tokens, so the floor is for the GPU, where
#: the Triton kernel runs 0.34-0.40x of flash when it skips nothing and breaks even only at ~70 % skipped tiles
#: (benchmarks/gpu/results), short calls cost well under a millisecond each, and the release-size calls all lie
#: above it (Wan 480p 32,760, SANA-Video 2.0 720p 23,000, MiniMax-H3 38,016 tokens)
DEFAULT_MIN_TOKENS = 12_288

#: how a Sol-Attn call that skipped no work is counted (not as a fast call)
NOTHING_SKIPPED = ("Sol-Attn ran but skipped nothing: it computed every block pair exactly at this tau and sequence "
                   "length (or every row was recomputed densely)")


def sol_attn_runs(site: Any) -> int:
    """A site report's calls that ran the Sol-Attn op: the fast ones and those whose blocks were all exact (counted
    :data:`NOTHING_SKIPPED`, not as fast), i.e. every call the dense policy let through."""
    return site.fast_calls + site.reference_calls.get(NOTHING_SKIPPED, 0)


#: Sol-Attn's dense policy, read by both routes (``apply(backend="sol_attn")``'s sites and diffusers'
#: ``set_attention_backend("sol_attn")``) through :func:`accelpatch.core.steps.step_policy_reason`: the first
#: ``dense_steps`` steps, the last ``dense_last_steps``, calls shorter than ``min_tokens``, and (sites only) the
#: ``dense_layers``
DENSE_STEP = "dense step (step < dense_steps)"
DENSE_LAST_STEP = "dense last step (in dense_last_steps)"
DENSE_LAYER = "dense layer (in dense_layers)"
SHORT_SEQUENCE = "short sequence (fewer tokens than min_tokens)"
#: a fraction of the steps (or a dense tail) in a call whose number of steps no source gives runs dense, counted
TOTAL_UNKNOWN = ("this call's number of denoising steps is unknown, so a dense_steps fraction or dense_last_steps "
                 "cannot apply and the call runs dense: apply() the pipeline (its scheduler gives it), wrap the call "
                 "in accelpatch.denoising_step(i, total=N), or give dense_steps as a count and dense_last_steps=0")
#: a call with ``dense_steps`` > 0 whose step no source knows (:mod:`accelpatch.core.steps`) runs dense, counted
STEP_UNKNOWN = ("no denoising step is known, so dense_steps cannot apply and the call runs dense: wrap the call in "
                "accelpatch.denoising_step(i) or set dense_steps=0 (under apply(), a diffusers pipeline or a timestep "
                "argument also gives the step; inside a whole-model torch.compile graph only denoising_step() is "
                "seen: compile the blocks instead)")


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_layers(value: Union[str, Iterable[int]], name: str = "dense_layers") -> frozenset[int]:
    """``"0,1,3-5"`` → {0, 1, 3, 4, 5}; ``""`` → {}; an iterable of non-negative ints is taken as is. An empty
    entry (``"0,,1"``, ``"0,"``) is refused: it is a typo more often than a choice. ``name`` is the option's name in
    error messages."""
    if isinstance(value, str):
        layers: set[int] = set()
        if not value.strip():
            return frozenset()
        for part in value.split(","):
            if not part.strip():
                raise ValueError(f"{name}: {value!r} has an empty entry (two commas in a row, or a comma at an end); "
                                 "use a comma list such as '0,1,3-5', or '' for none")
            match = _RANGE.match(part)
            if match is None:
                raise ValueError(f"{name}: {part.strip()!r} in {value!r} is not a layer index or a range "
                                 "like '3-5'; use a comma list such as '0,1,3-5', or '' for none")
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise ValueError(f"{name}: range {part.strip()!r} in {value!r} runs backwards")
            layers.update(range(lo, hi + 1))
        return frozenset(layers)
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{name} must be a comma list such as '0,1,3-5' or an iterable of ints, "
                         f"got {value!r}") from None
    for item in items:
        if not isinstance(item, numbers.Integral) or isinstance(item, bool) or item < 0:
            raise ValueError(f"{name}: {item!r} is not a non-negative layer index (in {value!r})")
    return frozenset(int(i) for i in items)


def format_layers(layers: Iterable[int]) -> str:
    """{0, 1, 2, 5} → ``"0-2,5"``: the form :func:`parse_layers` reads."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def all_layers_dense_reason(config: "SolAttnConfig", layers: Iterable[int], model_name: str, *, what: str,
                            defaulted: bool) -> Optional[str]:
    """Why ``sol_attn`` can never run sparse on a model whose sol_attn ``layers`` (``what``: "layers", "anchor
    layers") all lie in ``config.dense_layers`` (None when one can); ``defaulted``: the model chose them."""
    layers = frozenset(layers)
    if not layers or not layers <= config.dense_layers:
        return None
    source = "the model's default, as none were given" if defaulted else "as given"
    return (f"sol_attn never runs sparse on {model_name}: dense_layers={format_layers(config.dense_layers)!r} "
            f"({source}) cover all {len(layers)} of its {what} ({format_layers(layers)}); pass dense_layers='' or "
            "fewer layers")


def _check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> Optional[int]:
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        allowed = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SolAttnConfig:
    """Options of ``apply(model, backend="sol_attn", ...)``; see the module docstring. Diffusers' own switch
    (``set_attention_backend("sol_attn")``, :func:`accelpatch.sol_attn.configure_sol_attn_backend`) keeps its
    process-wide options in this type too, those of :data:`accelpatch.sol_attn.diffusers_backend.OPTIONS`, with
    its own defaults (``dense_steps=0``, ``sink_tokens=0``; see
    :func:`accelpatch.sol_attn.diffusers_backend.backend_config`).

    ``dense_steps`` (first steps dense) and ``dense_last_steps`` (last steps dense, default none) are counts or
    fractions of the call's steps (see the module docstring; ``dense_steps`` defaults to 0.2, the first 20 %: 10 of
    50 steps as the prior art, 1 of 4); ``min_tokens`` (default :data:`DEFAULT_MIN_TOKENS`, 12,288; 0: none) keeps
    attention over fewer tokens dense, counted as not applicable: tiny test models set it to 0.

    ``dense_layers`` None is the model's default (MiniMax-H3: layers 0 and 1, as the prior art; SANA-Video 2.0: its
    first anchor layer). ``sink_tokens``/``sink_start`` default to None: the model derives the sink per call
    (MiniMax-H3: the text/audio rows of the packed layout; SANA-Video 2.0: none, text enters by cross-attention).
    ``kv_splits="auto"`` picks 4 on SM 9.0 for T ≥ 65,536, else 1.

    ``dense_rows="text_audio"`` (default) recomputes the text and audio query rows of MiniMax-H3's packed sequence
    with the model's dense attention over every key, so only video query rows are sparse: the prior art found that
    restricting sparse attention to the video rows cut the final-second audio nMSE by 87.7-97.4 % and raised the
    audio correlation from 0.57 to 0.82, for a dense pass over those rows only. ``"none"``: every query row runs
    Sol-Attn (the text/audio keys stay the exact sink). Models without such rows (SANA-Video 2.0's anchors) are
    unaffected by either value.
    """

    tau: float = 1.0
    thresh_type: str = "diag"
    dense_steps: Union[int, float] = DEFAULT_DENSE_STEPS
    dense_layers: Optional[frozenset] = None
    sink_tokens: Optional[int] = None
    sink_start: Optional[int] = None
    kv_splits: Union[str, int] = "auto"
    impl: str = "auto"
    strict: bool = False
    dense_rows: str = "text_audio"
    dense_last_steps: Union[int, float] = 0
    min_tokens: int = DEFAULT_MIN_TOKENS

    name = "sol_attn"

    def __post_init__(self) -> None:
        set_ = lambda key, value: object.__setattr__(self, key, value)  # noqa: E731 - frozen dataclass
        if isinstance(self.tau, bool) or not isinstance(self.tau, numbers.Real) or not math.isfinite(self.tau):
            raise ValueError(f"tau must be a finite float (higher = sparser; -1e9 = dense), got {self.tau!r}")
        set_("tau", float(self.tau))
        if self.thresh_type not in THRESH_TYPES:
            raise ValueError(f"thresh_type must be one of {', '.join(THRESH_TYPES)}, got {self.thresh_type!r}")
        set_("dense_steps", normalize_step_count(self.dense_steps, "dense_steps"))
        set_("dense_last_steps", normalize_step_count(self.dense_last_steps, "dense_last_steps"))
        set_("min_tokens", _check_int("min_tokens", self.min_tokens, 0))
        if self.dense_layers is not None:
            set_("dense_layers", parse_layers(self.dense_layers))
        set_("sink_tokens", _check_int("sink_tokens", self.sink_tokens, 0, allow_none=True))
        set_("sink_start", _check_int("sink_start", self.sink_start, 0, allow_none=True))
        if self.sink_start is not None and self.sink_tokens is None:
            raise ValueError(f"sink_start={self.sink_start} needs sink_tokens too (or leave both None to derive "
                             "the sink from the packed layout)")
        if self.kv_splits != "auto" and (isinstance(self.kv_splits, bool) or self.kv_splits not in KV_SPLITS):
            raise ValueError(f"kv_splits must be 1, 2, 4 or 'auto', got {self.kv_splits!r}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict must be True or False, got {self.strict!r}")
        if not isinstance(self.dense_rows, str) or self.dense_rows not in DENSE_ROWS:
            hint = " (a string: in YAML write dense_rows: none or dense_rows: text_audio)" if isinstance(
                self.dense_rows, bool) or self.dense_rows is None else ""
            raise ValueError(f"dense_rows must be one of {', '.join(map(repr, DENSE_ROWS))} (text/audio query rows "
                             f"dense, or none), got {self.dense_rows!r}{hint}")

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def unknown_options_message(cls, unknown: Iterable[str]) -> str:
        unknown = sorted(unknown)
        hints = [f"{name!r} → {close[0]!r}?" for name in unknown
                 for close in [difflib.get_close_matches(name, cls.option_names(), n=1)] if close]
        return (f"unknown sol_attn option(s) {unknown}; valid options: {', '.join(cls.option_names())}"
                + (f" (did you mean {', '.join(hints)})" if hints else ""))

    @classmethod
    def from_options(cls, **options: Any) -> "SolAttnConfig":
        unknown = set(options) - set(cls.option_names())
        if unknown:
            raise ValueError(cls.unknown_options_message(unknown))
        return cls(**options)

    def resolve_kv_splits(self, device, seq_len: int) -> int:
        """'auto' → 4 on an SM 9.0 GPU for long sequences (≥ 65,536 rows), else 1."""
        if self.kv_splits != "auto":
            return int(self.kv_splits)
        if getattr(device, "type", str(device)) == "cuda" and seq_len >= 65536:
            import torch

            if torch.cuda.get_device_capability(device) == (9, 0):
                return 4
        return 1


def _checked_init(init):
    """The dataclass ``__init__``, with unknown keyword options named alongside the valid ones (a bare TypeError
    from the generated ``__init__`` names neither)."""

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(type(self).option_names())
        if unknown:
            raise TypeError(type(self).unknown_options_message(unknown))
        if len(args) > len(type(self).option_names()):
            raise TypeError(f"SolAttnConfig takes at most {len(type(self).option_names())} options, got {len(args)} "
                            f"positional arguments; pass options by name: {', '.join(type(self).option_names())}")
        init(self, *args, **kwargs)

    return __init__


SolAttnConfig.__init__ = _checked_init(SolAttnConfig.__init__)

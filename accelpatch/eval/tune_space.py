"""What ``accelpatch.tune`` searches: the monotone knobs that apply to a patched model, each an ordered grid.

Every knob is an ``apply()`` option whose values are ordered from the safest (slowest, closest to the reference) to
the loosest (fastest, furthest): the search (:mod:`accelpatch.eval.tune_search`) relies on that order. The
direction of each knob, read from the code that uses it:

=======================  ==========================  ===============================================================
knob                     faster (and worse) when     why (where in the code)
=======================  ==========================  ===============================================================
``cache_threshold``      higher                      reuse when the first block's residual moved less than it
                                                     (step_cache.py: ``<= self.config.threshold``)
``cache_max_reuse``      higher                      more consecutive reused steps allowed (step_cache.py guard)
``cache_warmup_steps``   lower                       steps before it never reuse (step_cache.py guard)
``cache_final_steps``    lower                       last steps that never reuse (step_cache.py guard)
``tau``                  higher                      sol_attn keeps fewer blocks exact (SolAttnConfig: "higher =
                                                     sparser; -1e9 = dense")
``dense_steps``          lower                       the first N steps run dense (a count, or a fraction of the
                                                     call's steps; sol_attn/sites.py ``dense_policy``)
``dense_last_steps``     lower                       the last N steps run dense (a dense tail is safer)
``min_tokens``           lower                       attention over fewer tokens runs dense (sol_attn/sites.py)
``dense_layers``         fewer layers                those layers always run dense (sites/sol_attention.py)
``anchor_fp32_steps``    lower                       the first N steps keep FP32 anchors (adapters/sana_video2)
``anchor_fp32_layers``   fewer layers                those anchors always keep FP32 (adapters/sana_video2)
=======================  ==========================  ===============================================================

``space=None`` takes the knobs of what the model is patched with: the step cache's when it has a FirstBlockCache,
the backend's when it runs ``sol_attn``, SANA-Video 2.0's anchor options when it runs its own BF16 anchors (under
``sol_attn`` they do nothing). A user's space (``{"tau": [0.5, 1, 2], ...}``) is checked: an unknown knob, or one
the model's family cannot take (``tau`` on SANA-Video, which runs no ``sol_attn``), is refused with the knobs it
can take, and its values are put in the safe-to-fast order above (step counts by the steps they keep in the
recipe's call: ``0.2`` of 50 steps is 10, so it is safer than ``5``).

**Sol-Attn's grid** (derived, bounded): ``tau`` the five of :data:`TAUS` and the current value (at most 6);
``dense_steps`` the current value, the fractions :data:`DENSE_FRACTIONS` (0.3, 0.2, 0.1 of the call's steps) and 0,
one per step count they give at the call's ``num_inference_steps`` (the current value keeps its count, else the
larger fraction: at 4 steps 0.2 and 0.1 are both 1 step, and 0.2 is kept), at most 5; ``dense_last_steps`` the
current value, 1 and 0, one per count (at most 3); ``min_tokens`` the current floor and the default one
(:data:`MIN_TOKENS_FLOOR` where ``SolAttnConfig``'s default is 0) and 0, at most 3, each floor only where it keeps
some of the call's Sol-Attn calls dense and not all of them (one probe call per floor, :func:`measure_floor_effect`): a floor
at or under every sequence is the same as 0, and one above every sequence the same as all-dense, neither worth a
candidate of its own (a current floor above every sequence is searched at 0: it would make every other knob moot);
``dense_layers`` at most 5. So the Sol-Attn grid has at most 6 x 5 x 3 x 3 x 5 = 1,350 points, of which the
search (bisection per knob, then the combination) validates a few dozen at most.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accelpatch.core.steps import normalize_step_count, step_count
from accelpatch.core.errors import did_you_mean
from accelpatch.recipes import CandidateSpec
from accelpatch.sol_attn.config import DEFAULT_MIN_TOKENS

__all__ = ["Knob", "SearchSpace", "KNOB_DIRECTIONS", "derive_space", "parse_space", "parse_budget", "base_setting"]

#: knob → (owner, direction): "up" = a higher value is faster and worse, "down" = lower, "fewer" = fewer layers
KNOB_DIRECTIONS: dict[str, tuple[str, str]] = {
    "cache_threshold": ("step cache", "up"),
    "cache_max_reuse": ("step cache", "up"),
    "cache_warmup_steps": ("step cache", "down"),
    "cache_final_steps": ("step cache", "down"),
    "tau": ("sol_attn", "up"),
    "dense_steps": ("sol_attn", "down"),
    "dense_last_steps": ("sol_attn", "down"),
    "min_tokens": ("sol_attn", "down"),
    "dense_layers": ("sol_attn", "fewer"),
    "anchor_fp32_steps": ("SANA-Video 2.0 anchors", "down"),
    "anchor_fp32_layers": ("SANA-Video 2.0 anchors", "fewer"),
}
CACHE_KNOBS = ("cache_threshold", "cache_max_reuse", "cache_warmup_steps", "cache_final_steps")
SOL_KNOBS = ("tau", "dense_steps", "dense_layers", "dense_last_steps", "min_tokens")
#: knobs whose values are numbers of steps: a count or a fraction of the call's steps (ordered by the count)
STEP_KNOBS = ("cache_warmup_steps", "cache_final_steps", "dense_steps", "dense_last_steps", "anchor_fp32_steps")
ANCHOR_KNOBS = ("anchor_fp32_steps", "anchor_fp32_layers")
LAYER_KNOBS = ("dense_layers", "anchor_fp32_layers")

#: default grids (safe → fast) where the model does not suggest one
CACHE_THRESHOLDS = (0.02, 0.05, 0.1, 0.2, 0.5)
CACHE_MAX_REUSE = (1, 2, 3, 4)
TAUS = (0.0, 0.5, 1.0, 2.0, 4.0)
#: dense_steps searched as fractions of the call's steps (with the current value and 0)
DENSE_FRACTIONS = (0.3, 0.2, 0.1)
#: dense_last_steps searched (with the current value): a dense last step, and none
DENSE_TAILS = (1, 0)
#: the sequence floor searched where the user's min_tokens is 0: the backend's default (ComfyUI's sparse node's)
MIN_TOKENS_FLOOR = DEFAULT_MIN_TOKENS
#: when the call does not say how many steps it runs (diffusers' usual default)
DEFAULT_STEPS = 50


@dataclass(frozen=True)
class Knob:
    """One option to search: ``values`` ordered safe (index 0, slowest) → loose (last, fastest)."""

    name: str
    values: tuple
    owner: str

    def to_dict(self) -> dict:
        return {"name": self.name, "owner": self.owner, "direction": KNOB_DIRECTIONS[self.name][1],
                "values": list(self.values)}


@dataclass(frozen=True)
class SearchSpace:
    """The fixed part of every candidate (``backend`` and ``options``, under the ``high`` tier) and the knobs."""

    backend: Optional[str]
    options: dict = field(default_factory=dict)
    knobs: tuple[Knob, ...] = ()

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(k.values) for k in self.knobs)

    def setting(self, point: Sequence[int]) -> dict:
        """The knob values at ``point`` (one grid index per knob)."""
        return {k.name: k.values[i] for k, i in zip(self.knobs, point)}

    def spec(self, point: Sequence[int]) -> CandidateSpec:
        """The candidate at ``point``: the fixed backend and options with the knobs' values."""
        return CandidateSpec(tier="high", backend=self.backend, options={**self.options, **self.setting(point)})

    def size(self) -> int:
        return math.prod(self.sizes) if self.knobs else 0

    def to_dict(self) -> dict:
        return {"backend": self.backend, "options": dict(self.options), "knobs": [k.to_dict() for k in self.knobs],
                "grid_points": self.size()}


# --- budget ----------------------------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_budget(budget: Any) -> float:
    """Seconds from ``budget``: a positive number of seconds, or a string such as ``"90s"``, ``"30m"``, ``"1h"``,
    ``"1h30m"`` (a bare number in a string is seconds). Anything else raises ValueError naming the forms."""
    forms = "a positive number of seconds or a duration such as '90s', '30m', '1h', '1h30m'"
    if isinstance(budget, bool):
        raise ValueError(f"budget must be {forms}, got {budget!r}")
    if isinstance(budget, numbers.Real):
        seconds = float(budget)
    elif isinstance(budget, str):
        text = budget.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"budget {budget!r} is not a duration; give {forms}") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"budget must be {forms}, got {type(budget).__name__} {budget!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"budget must be {forms}, got {budget!r}")
    return seconds


# --- the patched model's setting --------------------------------------------------------------------------------

@dataclass
class BaseSetting:
    """What a pipeline is patched with, as ``apply()`` options: the backend name, its options, the family's
    options, the step cache's (``cache="first_block"`` and its guards), and what tune needs to know of the model."""

    backend: Optional[str]
    backend_options: dict
    family_options: dict
    cache_options: dict
    cache_method: Optional[str]
    family: str
    anchors: tuple[int, ...]
    layers: int
    default_dense_layers: Optional[frozenset]
    family_resolved: Any = None
    #: what the family can take at all (the adapter's): backend names and step-cache methods
    family_backends: tuple[str, ...] = ()
    family_cache_methods: tuple[str, ...] = ()

    @property
    def options(self) -> dict:
        return {**self.backend_options, **self.family_options, **self.cache_options}


def _layers_text(value: Any) -> str:
    from accelpatch.sol_attn.config import format_layers, parse_layers

    return format_layers(parse_layers(value) if not isinstance(value, frozenset) else value)


def base_setting(pipe: Any) -> BaseSetting:
    """The patch of ``pipe``'s transformer (``apply()`` defaults when it is unpatched) as ``apply()`` options."""
    from dataclasses import fields as dataclass_fields

    from accelpatch.models.registry import find_adapter
    from accelpatch.sol_attn.config import SolAttnConfig
    from accelpatch.core.patcher import patch_of, transformers_of

    model = transformers_of(pipe, verb="tune")[0]
    adapter = find_adapter(model)
    patch = patch_of(model)
    backend = backend_options = None
    family_options, cache_options, method = {}, {}, None
    if patch is not None:
        backend_config, _strict, options, _tier, arguments = patch.requested
        cache = dict(arguments).get("cache")
        if isinstance(backend_config, SolAttnConfig):
            backend, backend_options = "sol_attn", {}
            for f in dataclass_fields(SolAttnConfig):
                value = getattr(backend_config, f.name)
                if value is None or value == f.default:
                    continue
                backend_options[f.name] = _layers_text(value) if f.name in LAYER_KNOBS else value
        elif backend_config is not None:
            raise ValueError(f"tune knows the knobs of backend 'sol_attn' only; this model runs "
                             f"{type(backend_config).__name__}")
        family_options = {k: (_layers_text(v) if k in LAYER_KNOBS else v) for k, v in dict(options).items()}
        if cache is not None:
            method = cache.method
            if cache.method == "first_block":
                cache_options = {"cache": "first_block", "cache_threshold": cache.threshold,
                                 "cache_warmup_steps": cache.warmup_steps, "cache_max_reuse": cache.max_reuse,
                                 "cache_final_steps": cache.final_steps}
            else:  # a calibrated MagCache: kept as it is, not searched
                cache_options = {"cache": cache.diffusers_config}
    anchors = tuple(getattr(model, "softmax_layer_indices", ()) or ())
    blocks = getattr(model, "transformer_blocks", None) or getattr(model, "blocks", None) or ()
    default_dense = None
    if backend == "sol_attn":
        completed = adapter.complete_backend(SolAttnConfig(**{k: v for k, v in backend_options.items()}), model)
        default_dense = completed.dense_layers
    resolved = adapter.resolve_options(family_options) if adapter.options_class is not None else None
    return BaseSetting(backend=backend, backend_options=backend_options or {}, family_options=family_options,
                       cache_options=cache_options, cache_method=method, family=adapter.family, anchors=anchors,
                       layers=len(blocks), default_dense_layers=default_dense, family_resolved=resolved,
                       family_backends=tuple(adapter.backends), family_cache_methods=tuple(adapter.cache.methods))


# --- grids -------------------------------------------------------------------------------------------------------

def _steps_of(call_kwargs: Mapping[str, Any]) -> int:
    steps = call_kwargs.get("num_inference_steps", DEFAULT_STEPS)
    return int(steps) if isinstance(steps, numbers.Integral) and steps > 0 else DEFAULT_STEPS


def _step_grid(current: Any, steps: int) -> tuple:
    """Step counts from the safest (every step kept, capped at ``steps``) down to 0, at most about six; ``current``
    (a count, or a fraction of the call's steps) is one of them, in the form given (a fraction stays a fraction)
    where the count it is in this call of ``steps``."""
    given = None if current is None else normalize_step_count(current)
    current = None if current is None else step_count(current).of(steps)
    top = min(steps, max(current or 0, 0) or steps)
    values = {top, (3 * top) // 4, top // 2, top // 4, 2, 1, 0}
    if current is not None:
        values.add(min(current, steps))
    counts = sorted((v for v in values if 0 <= v <= top), reverse=True)
    return tuple(given if v == current and given is not None else v for v in counts)


def _count_grid(current: Any, steps: int, values: Sequence) -> tuple:
    """Step-count values in the user's form (a fraction stays a fraction), safest (most steps in a call of
    ``steps``) first: ``current`` (None: none), then ``values`` largest first, then 0; one per count they give, the
    first met keeping it (the current value, else the larger fraction)."""
    chosen: dict[int, Any] = {}
    ordered = sorted(values, key=lambda v: step_count(v).of(steps), reverse=True)
    for value in ([] if current is None else [current]) + ordered + [0]:
        chosen.setdefault(step_count(value).of(steps), normalize_step_count(value))
    return tuple(chosen[n] for n in sorted(chosen, reverse=True))


#: what a sequence floor does to one call's Sol-Attn calls: keeps none of them dense, some, or all (None: unknown)
FLOOR_NONE, FLOOR_SOME, FLOOR_ALL = "none", "some", "all"


def _floor_grid(current: int, default: int, effect: "Callable[[int], Optional[str]]") -> tuple[tuple[int, ...], bool]:
    """``min_tokens`` values, highest (safest) first, and whether ``current`` must be searched at 0: each of
    ``current`` and ``default`` (0: :data:`MIN_TOKENS_FLOOR`) whose ``effect`` on the call is :data:`FLOOR_SOME`
    (a floor that keeps none of its calls dense is 0, one that keeps all dense is all-dense: neither is a candidate
    of its own), then 0. The flag: ``current`` keeps every call dense, so 0 replaces it in the fixed options."""
    floors = sorted({v for v in (current, default or MIN_TOKENS_FLOOR) if v}, reverse=True)
    kept = tuple(v for v in floors if effect(v) == FLOOR_SOME)
    return kept + (0,), bool(current) and current not in kept and effect(current) == FLOOR_ALL


def measure_floor_effect(pipe: Any, call_kwargs: Mapping[str, Any], options: Mapping[str, Any]
                         ) -> "Callable[[int], Optional[str]]":
    """``effect(floor)``: what ``min_tokens=floor`` does to the Sol-Attn calls of one call of ``pipe`` (none, some
    or all of them kept dense; None when no call reached the length check, e.g. sites not mounted here, or when the
    probe raised), measured once per floor by a probe call: ``options`` with no dense step, tail or layer and no
    step cache, at most two denoising steps where the call names ``num_inference_steps`` (the sequence does not
    depend on it). The pipeline ends in the patch state it came in."""
    seen: dict[int, Optional[str]] = {}

    def effect(floor: int) -> Optional[str]:
        if floor not in seen:
            seen[floor] = _probe_floor(pipe, call_kwargs, options, floor)
        return seen[floor]

    return effect


def _probe_floor(pipe: Any, call_kwargs: Mapping[str, Any], options: Mapping[str, Any], floor: int) -> Optional[str]:
    import warnings

    import torch

    import accelpatch
    from accelpatch.core.patcher import transformers_of
    from accelpatch.core.reporting import build_report
    from accelpatch.eval.candidates import PatchSwitcher
    from accelpatch.sol_attn.config import SHORT_SEQUENCE, sol_attn_runs

    probe = {k: v for k, v in options.items() if k != "cache" and not k.startswith("cache_")}
    probe.update(dense_steps=0, dense_last_steps=0, dense_layers="", min_tokens=floor)
    spec = CandidateSpec(tier="high", backend="sol_attn", options=probe)
    kwargs = dict(call_kwargs)
    if isinstance(kwargs.get("num_inference_steps"), numbers.Integral):
        kwargs["num_inference_steps"] = min(2, int(kwargs["num_inference_steps"]))  # some schedulers need 2
    kwargs["generator"] = torch.Generator(device="cpu").manual_seed(0)
    models = transformers_of(pipe, verb="tune")
    switcher = PatchSwitcher(pipe)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            switcher.enter(spec)
            build_report(models, reset=True)
            with torch.no_grad(), accelpatch.quality("high"):
                pipe(**kwargs)
            report = build_report(models, reset=True)
    except Exception:  # noqa: BLE001 - a probe that cannot run leaves the floor unsearched (KeyboardInterrupt stops)
        return None
    finally:
        switcher.restore()
    sparse = [site for site in report.sites if site.work == "sparse"]
    short = sum(site.reference_calls.get(SHORT_SEQUENCE, 0) + site.fallback_calls.get(SHORT_SEQUENCE, 0)
                for site in sparse)
    ran = sum(sol_attn_runs(site) for site in sparse)
    if not short and not ran:
        return None
    return FLOOR_NONE if not short else FLOOR_ALL if not ran else FLOOR_SOME


def _sol_default(name: str) -> Any:
    """``SolAttnConfig``'s default of option ``name`` (read, not copied: the defaults may change)."""
    from dataclasses import fields as dataclass_fields

    from accelpatch.sol_attn.config import SolAttnConfig

    return next(f.default for f in dataclass_fields(SolAttnConfig) if f.name == name)


def _layer_grid(layers: Sequence[int]) -> tuple[str, ...]:
    """Nested layer sets from all of ``layers`` down to none (prefixes, at most about five), as comma lists."""
    from accelpatch.sol_attn.config import format_layers

    layers = sorted(layers)
    n = len(layers)
    lengths = sorted({n, (3 * n) // 4, n // 2, 1 if n else 0, 0}, reverse=True)
    return tuple(format_layers(layers[:length]) for length in lengths)


def _merged(values: Sequence, current: Any, direction: str) -> tuple:
    """``values`` with ``current`` added, in safe-to-fast order for ``direction``."""
    out = set(values)
    if current is not None:
        out.add(current)
    return tuple(sorted(out, reverse=(direction == "down")))


def derive_space(pipe: Any, call_kwargs: Mapping[str, Any], *,
                 floor_effect: "Optional[Callable[[int], Optional[str]]]" = None) -> SearchSpace:
    """The knobs that apply to ``pipe`` as it is patched (see the module docstring). ``floor_effect(floor)`` says
    what a ``min_tokens`` floor does to the call's Sol-Attn calls (:data:`FLOOR_NONE`/``SOME``/``ALL``, None:
    unknown); None: measured by :func:`measure_floor_effect`'s probe calls. Raises ValueError when no knob applies, saying
    what to patch the model with."""
    base = base_setting(pipe)
    steps = _steps_of(call_kwargs)
    knobs: list[Knob] = []
    override: dict[str, Any] = {}
    if base.cache_method == "first_block":
        c = base.cache_options
        knobs += [Knob("cache_threshold", _merged(CACHE_THRESHOLDS, c["cache_threshold"], "up"), "step cache"),
                  Knob("cache_max_reuse", _merged(CACHE_MAX_REUSE, c["cache_max_reuse"], "up"), "step cache"),
                  Knob("cache_warmup_steps", _step_grid(c["cache_warmup_steps"], min(steps, 4)), "step cache")]
    if base.backend == "sol_attn":
        options = base.backend_options
        knobs.append(Knob("tau", _merged(TAUS, options.get("tau", _sol_default("tau")), "up"), "sol_attn"))
        knobs.append(Knob("dense_steps", _count_grid(options.get("dense_steps", _sol_default("dense_steps")), steps,
                                                     DENSE_FRACTIONS), "sol_attn"))
        knobs.append(Knob("dense_last_steps", _count_grid(options.get("dense_last_steps",
                                                                      _sol_default("dense_last_steps")),
                                                          steps, DENSE_TAILS), "sol_attn"))
        dense = sorted(base.default_dense_layers or ())
        if dense:
            knobs.append(Knob("dense_layers", _layer_grid(dense), "sol_attn"))
        if floor_effect is None:
            floor_effect = measure_floor_effect(pipe, call_kwargs, base.options)
        floors, searched_at_zero = _floor_grid(options.get("min_tokens", _sol_default("min_tokens")),
                                               _sol_default("min_tokens"), floor_effect)
        knobs.append(Knob("min_tokens", floors, "sol_attn"))
        if searched_at_zero:
            override["min_tokens"] = 0
    elif base.anchors and base.family_resolved is not None and hasattr(base.family_resolved, "anchor_fp32_steps"):
        resolved = base.family_resolved
        knobs.append(Knob("anchor_fp32_steps", _step_grid(resolved.anchor_fp32_steps, steps),
                          "SANA-Video 2.0 anchors"))
        fp32 = sorted(resolved.anchor_fp32_layers) or list(base.anchors)
        knobs.append(Knob("anchor_fp32_layers", _layer_grid(fp32), "SANA-Video 2.0 anchors"))
    knobs = [k for k in knobs if len(k.values) > 1]
    if not knobs:
        raise ValueError(f"nothing to tune on this {base.family} pipeline as it is patched: tune searches the step "
                         "cache's knobs (apply(pipe, cache='first_block')), sol_attn's (apply(pipe, "
                         "backend='sol_attn')) and SANA-Video 2.0's anchor options; or give space={knob: values}")
    fixed = {k: v for k, v in {**base.options, **override}.items() if k not in {knob.name for knob in knobs}}
    return SearchSpace(backend=base.backend, options=fixed, knobs=tuple(knobs))


def _valid_knobs(base: BaseSetting) -> list[str]:
    """The knobs a user's space may name on this model: only those its family can take (SANA-Video runs no
    ``sol_attn``, so ``tau``/``dense_steps``/``dense_layers`` are not offered there), so the error lists no knob
    that would fail later when its candidates are applied."""
    valid = []
    if "first_block" in base.family_cache_methods and base.cache_method in (None, "first_block"):
        valid += CACHE_KNOBS
    if "sol_attn" in base.family_backends:
        valid += SOL_KNOBS
    if base.anchors:
        valid += ANCHOR_KNOBS
    return valid


def _not_applicable(name: str, base: BaseSetting) -> str:
    """Why a known knob ``name`` is not one this model can take (for the error naming the valid ones)."""
    owner = KNOB_DIRECTIONS[name][0]
    if name in SOL_KNOBS:
        return f"it is a knob of backend 'sol_attn', which {base.family} models cannot run"
    if name in CACHE_KNOBS:
        if base.cache_method not in (None, "first_block"):
            return f"this model runs a calibrated {base.cache_method!r} step cache, kept as it is"
        return f"{base.family} models run no first-block step cache"
    return f"it is an option of the {owner}, which this {base.family} model does not have"


def _order(name: str, values: Sequence, steps: int = DEFAULT_STEPS) -> tuple:
    """A user's ``values`` for knob ``name`` in safe-to-fast order (duplicates dropped). Step knobs take counts,
    fractions and percentages, kept in the form given, ordered by the steps they keep in a call of ``steps`` (one
    value per count, the first given keeping it)."""
    from accelpatch.sol_attn.config import parse_layers

    direction = KNOB_DIRECTIONS[name][1]
    if name in STEP_KNOBS:
        chosen: dict[int, Any] = {}
        for v in values:
            try:
                chosen.setdefault(step_count(v, name).of(steps), normalize_step_count(v, name))
            except ValueError as error:
                raise ValueError(f"space: {error} (in {list(values)!r})") from None
        return tuple(chosen[n] for n in sorted(chosen, reverse=True))
    if direction == "fewer":
        parsed = {}
        for v in values:
            parsed.setdefault(_layers_text(v), len(parse_layers(v, name)))
        return tuple(sorted(parsed, key=lambda text: -parsed[text]))
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"space: {name} takes numbers, got {v!r} in {list(values)!r}")
    return tuple(sorted(set(values), reverse=(direction == "down")))


def parse_space(pipe: Any, space: Any, call_kwargs: Optional[Mapping[str, Any]] = None) -> SearchSpace:
    """A user's space: a :class:`SearchSpace`, or a mapping knob → values (a list, or one value to fix it).
    Unknown knobs are refused with the valid ones; sol_attn knobs on a model patched without a backend select
    ``backend="sol_attn"``, cache knobs on a model without a cache add ``cache="first_block"``. ``call_kwargs``
    give the call's steps, by which step knobs are ordered (default 50)."""
    if isinstance(space, SearchSpace):
        return space
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"space must be a non-empty mapping of knob → values (e.g. {{'tau': [0.5, 1.0, 2.0]}}) or "
                         f"None to derive it from the model; got {space!r}")
    base = base_setting(pipe)
    valid = _valid_knobs(base)
    refused = [name for name in space if name not in valid]
    if refused:
        name = str(refused[0])
        listed = f"knobs tune can search on this {base.family} model: {', '.join(valid) or 'none'}"
        if name in KNOB_DIRECTIONS:
            raise ValueError(f"space: knob {name!r} does not apply here ({_not_applicable(name, base)}); {listed}")
        raise ValueError(f"space: unknown knob {name!r}{did_you_mean(name, valid)}; {listed}")
    options = dict(base.options)
    backend = base.backend
    if any(name in SOL_KNOBS for name in space) and backend is None:
        backend = "sol_attn"
    if backend == "sol_attn" and any(name in ANCHOR_KNOBS for name in space):
        raise ValueError("space: anchor_fp32_steps/anchor_fp32_layers do nothing under backend 'sol_attn' (the "
                         "anchors run Sol-Attn): search one or the other")
    if any(name in CACHE_KNOBS for name in space) and "cache" not in options:
        options["cache"] = "first_block"
    knobs = []
    for name, values in space.items():
        if isinstance(values, (str, numbers.Real)) or not isinstance(values, Sequence):
            values = [values]
        values = list(values)
        if not values:
            raise ValueError(f"space: {name} has no values; give a list such as [0.5, 1.0]")
        knobs.append(Knob(name, _order(name, values, _steps_of(call_kwargs or {})), KNOB_DIRECTIONS[name][0]))
    names = {k.name for k in knobs}
    fixed = {k: v for k, v in options.items() if k not in names}
    for knob in [k for k in knobs if len(k.values) == 1]:
        fixed[knob.name] = knob.values[0]
    searched = tuple(k for k in knobs if len(k.values) > 1)
    if not searched:
        raise ValueError(f"space: every knob has one value ({', '.join(sorted(names))}): nothing to search")
    return SearchSpace(backend=backend, options=fixed, knobs=searched)

"""The ``sol_attn`` attention backend diffusers' dispatcher calls after ``model.set_attention_backend("sol_attn")``.

One function, :func:`sol_attn_backend`, with the native backend's signature: under ``quality("high")`` an eligible
call (self-attention q, k, v of one shape [B, T, H, D], no mask, not causal, dropout 0, the default scale, no GQA,
no LSE, no context parallelism, a float dtype) runs the Sol-Attn op (:mod:`accelpatch.sol_attn.op`); every other
call runs the *dense backend* unchanged, so outside ``high`` the model's output is the dense backend's, bit for bit.

The dense backend is ``configure_sol_attn_backend(dense_backend=...)`` when given, else diffusers' process default
(``DIFFUSERS_ATTN_BACKEND``, ``native`` unless that variable says otherwise): the backend a processor whose
``_attention_backend`` is None runs before any ``set_attention_backend`` call, i.e. what the model would have used.
(diffusers overwrites each processor's previous backend in ``set_attention_backend``, so a backend chosen per
processor before that is not recoverable; name it with ``dense_backend``.)

Calls that reach the backend through diffusers' process-global active backend (a processor whose
``_attention_backend`` is None, after *another* model's ``set_attention_backend("sol_attn")`` made ``sol_attn`` the
global default, diffusers#14249, or inside ``attention_backend("sol_attn")``) run :func:`sol_attn_via_global`:
always dense, counted under :data:`VIA_GLOBAL`. Only processors set to ``sol_attn`` themselves ever run sparse.

Options are process-wide (:func:`accelpatch.sol_attn.configure_sol_attn_backend`, which registers the backend and
calls :func:`set_options`): a :class:`~accelpatch.sol_attn.config.SolAttnConfig`, the type ``apply(...,
backend="sol_attn")`` takes, restricted to :data:`OPTIONS`, plus the name of the dense backend. The dispatcher passes
the backend no module, so it cannot tell models or layers apart: for that reason ``dense_layers`` and ``dense_rows``
cannot apply, and ``dense_steps`` only where the calling context names the step (``accelpatch.denoising_step(i)``;
a fraction or ``dense_last_steps`` also needs ``total=N``): default 0 here (:data:`DEFAULTS`); with a positive value
and no known step a call runs dense, counted. ``min_tokens`` keeps calls over fewer tokens dense (the policy). Counts are
process-wide too (:data:`COUNTERS`, compile-safe tallies).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch

from accelpatch.core import steps
from accelpatch.core.gate import SiteCounters
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.sol_attn.config import (DENSE_LAST_STEP, DENSE_STEP, NOTHING_SKIPPED, SHORT_SEQUENCE, STEP_UNKNOWN,
                                      TOTAL_UNKNOWN, SolAttnConfig)
from accelpatch.sol_attn.sites import FLOAT_DTYPES, count_routing

NAME = "sol_attn"

TIER = "tier below high: sol_attn runs sparse only under accelpatch.quality('high')"
VIA_GLOBAL = ("reached through diffusers' process-global active backend (a processor not set to sol_attn, "
              "diffusers#14249): only processors set by set_attention_backend('sol_attn') run it")
MASK = "attn_mask given: Sol-Attn takes unmasked attention"
CAUSAL = "is_causal=True: Sol-Attn is non-causal"
DROPOUT = "dropout_p > 0: Sol-Attn has no dropout"
SCALE = "a scale other than head_dim ** -0.5"
SHAPES = "q, k, v shapes differ (cross-attention): Sol-Attn is self-attention"
GQA = "enable_gqa=True"
LSE = "return_lse=True: Sol-Attn returns no log-sum-exp"
PARALLEL = "context parallelism: the sol_attn backend runs sparse on whole sequences only"
DTYPE = "q/k/v dtype is not one of fp32, bf16, fp16 (or they differ)"
#: every reason a call can run dense (prepared as compiled-code tallies ahead of time: no recompile when counted)
REASONS = (TIER, VIA_GLOBAL, MASK, CAUSAL, DROPOUT, SCALE, SHAPES, GQA, LSE, PARALLEL, DTYPE, DENSE_STEP,
           DENSE_LAST_STEP, SHORT_SEQUENCE, STEP_UNKNOWN, TOTAL_UNKNOWN)
#: the reasons that are the dense policy (counted as such, not as a fallback from an asked-for sparse call)
POLICY = (DENSE_STEP, DENSE_LAST_STEP, SHORT_SEQUENCE)
#: the :class:`SolAttnConfig` options the backend takes, in the order the report shows them (``dense_layers`` and
#: ``dense_rows`` need a module, ``strict`` a patched site: ``apply(..., backend="sol_attn")`` only)
OPTIONS = ("tau", "thresh_type", "sink_tokens", "sink_start", "kv_splits", "impl", "dense_steps", "dense_last_steps",
           "min_tokens")
#: the backend's defaults where they differ from apply()'s: a dispatcher call knows its step only when the caller
#: says so (no dense steps), and there is no layout to derive a sink from (none; None is refused)
DEFAULTS = {"dense_steps": 0, "sink_tokens": 0}


def backend_config(**options: Any) -> SolAttnConfig:
    """The backend's options as a :class:`SolAttnConfig`: those named in :data:`OPTIONS`, :data:`DEFAULTS` (then
    SolAttnConfig's defaults) for the others, validated as apply()'s."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown sol_attn backend option(s) {unknown}; valid options: "
                         f"{', '.join(OPTIONS + ('dense_backend',))} (dense_layers and dense_rows need "
                         "apply(..., backend='sol_attn'): the backend sees no module)")
    config = SolAttnConfig(**{**DEFAULTS, **options})
    if config.sink_tokens is None:
        raise ValueError("sink_tokens must be an int >= 0 (0: no sink), got None")
    return config


#: the backend's state in force, replaced as one tuple (threads never see a mix): its options, the name of its dense
#: backend (None: diffusers' process default, see the module docstring), and that dense backend's function and
#: argument names, resolved once per configuration (None until :func:`prime_dense`) so that a call does no name
#: lookup for torch.compile to trace
_state: tuple = (backend_config(), None, None, frozenset())
_state_lock = threading.Lock()
#: process-wide tallies of every call of the backend (eager and compiled)
COUNTERS = SiteCounters()
COUNTERS.prepare([(field, reason) for reason in REASONS for field in ("reference", "fallbacks")]
                 + [("fast", ""), ("reference", NOTHING_SKIPPED), ("stat_sums", "exact_fraction"),
                    ("stat_counts", "exact_fraction")])


def set_options(**options: Any) -> SolAttnConfig:
    """Set the ``sol_attn`` attention backend's options for this process (unnamed options keep their defaults, not
    their previous values); returns the options in force. Options: :data:`OPTIONS` (see :func:`backend_config`) and
    dense_backend (a registered diffusers backend name, checked here)."""
    global _state
    dense_backend = options.pop("dense_backend", None)
    config = backend_config(**options)
    if dense_backend is not None and not isinstance(dense_backend, str):
        raise ValueError(f"dense_backend must be a diffusers attention backend name or None, got {dense_backend!r}")
    if dense_backend is not None and dense_backend.strip().lower() == NAME:
        raise ValueError("dense_backend cannot be 'sol_attn' itself; name a dense backend such as 'native'")
    from accelpatch.sol_attn.op.dispatch import impl_unavailable_reason

    reason = impl_unavailable_reason(config.impl)
    if reason is not None:
        raise ValueError(reason)
    state = _resolved(config, dense_backend)  # raises for an unknown name (or a bad DIFFUSERS_ATTN_BACKEND) first
    steps.register_counts(config.dense_steps, steps.from_end(config.dense_last_steps))
    with _state_lock:
        _state = state
    return config


def current_config() -> SolAttnConfig:
    """The backend's options in force (its dense backend: :func:`options_in_force`)."""
    return _state[0]


def options_in_force() -> dict:
    """Every option of the backend in force, by name: :data:`OPTIONS` and ``dense_backend``."""
    config, dense_backend = _state[:2]
    return {**{name: getattr(config, name) for name in OPTIONS}, "dense_backend": dense_backend}


def resolve_dense(dense_backend: Optional[str]):
    """(member, function) of the dense backend named ``dense_backend`` (None: diffusers' process default)."""
    from diffusers.models import attention_dispatch as ad

    name = dense_backend if dense_backend is not None else ad.DIFFUSERS_ATTN_BACKEND
    valid = sorted(m.value for m in ad.AttentionBackendName if m.value != NAME)
    try:
        member = ad.AttentionBackendName(name.strip().lower())
    except ValueError:
        member = None
    if member is None or member.value == NAME or member not in ad._AttentionBackendRegistry._backends:
        raise ValueError(f"dense_backend {name!r} is not a registered diffusers attention backend; valid: "
                         f"{', '.join(valid)}")
    return member, ad._AttentionBackendRegistry._backends[member]


def _resolved(config: SolAttnConfig, dense_backend: Optional[str]) -> tuple:
    """The full state tuple (see :data:`_state`) of ``config`` and ``dense_backend``."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    member, fn = resolve_dense(dense_backend)
    if dense_backend is not None:  # what set_attention_backend checks: a missing package fails here
        from diffusers.models.attention_dispatch import (_check_attention_backend_requirements,
                                                         _maybe_download_kernel_for_backend)

        _check_attention_backend_requirements(member)
        _maybe_download_kernel_for_backend(member)
    return config, dense_backend, fn, frozenset(_AttentionBackendRegistry._supported_arg_names[member])


def prime_dense() -> tuple:
    """Resolve the dense backend of the state in force (its function and argument names) into :data:`_state`."""
    global _state
    with _state_lock:
        _state = _resolved(*_state[:2])
        return _state


def _dense(state: tuple, kwargs: dict) -> torch.Tensor:
    if state[2] is None:
        state = prime_dense()
    names = state[3]
    return state[2](**{k: v for k, v in kwargs.items() if k in names})


def ineligible_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                      parallel_config, config: SolAttnConfig) -> Optional[str]:
    """Why this call cannot run Sol-Attn (None when it can)."""
    if attn_mask is not None:
        return MASK
    if is_causal:
        return CAUSAL
    if dropout_p:
        return DROPOUT
    if enable_gqa:
        return GQA
    if return_lse:
        return LSE
    if parallel_config is not None:
        return PARALLEL
    if not (query.shape == key.shape == value.shape) or query.dim() != 4:
        return SHAPES
    if not (query.dtype == key.dtype == value.dtype) or query.dtype not in FLOAT_DTYPES:
        return DTYPE
    if scale is not None and scale != query.shape[-1] ** -0.5:
        return SCALE
    if config.min_tokens and query.shape[1] < config.min_tokens:
        return SHORT_SEQUENCE
    return steps.step_policy_reason(config.dense_steps, DENSE_STEP, STEP_UNKNOWN, last=config.dense_last_steps,
                                    last_reason=DENSE_LAST_STEP, total_reason=TOTAL_UNKNOWN)  # as apply()'s sites


def sol_attn_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: Optional[float] = None, enable_gqa: bool = False, return_lse: bool = False,
                     _parallel_config: Any = None) -> torch.Tensor:
    """The backend registered as ``sol_attn``: Sol-Attn under ``high`` where eligible, else the dense backend."""
    state = _state
    config = state[0]
    kwargs = dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                  scale=scale, enable_gqa=enable_gqa, return_lse=return_lse, _parallel_config=_parallel_config)
    if not effective_tier().admits(Tier.HIGH):
        COUNTERS.count_reference(TIER)
        return _dense(state, kwargs)
    reason = ineligible_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                               _parallel_config, config)
    if reason is not None:  # a dense step is the policy; any other reason: sparse was asked for but cannot run
        COUNTERS.count_reference(reason, fallback=reason not in POLICY)
        return _dense(state, kwargs)
    return run_sparse(config, query, key, value)


def run_sparse(config: SolAttnConfig, query, key, value) -> torch.Tensor:
    """The Sol-Attn op on q, k, v [B, T, H, D] with ``config``'s options (:func:`backend_config`); counted with its
    exact-block fraction."""
    from accelpatch.sol_attn.op import sol_attn

    kv_splits = config.resolve_kv_splits(query.device, query.shape[1])
    out, stats = sol_attn(query, key, value, tau=config.tau, thresh_type=config.thresh_type, kv_splits=kv_splits,
                          sink_tokens=config.sink_tokens, sink_start=config.sink_start, impl=config.impl,
                          return_stats=True)
    count_routing(COUNTERS, stats)
    return out


def sol_attn_via_global(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                        scale: Optional[float] = None, enable_gqa: bool = False, return_lse: bool = False,
                        _parallel_config: Any = None) -> torch.Tensor:
    """What a processor *not* set to ``sol_attn`` runs when ``sol_attn`` is diffusers' global active backend: the
    dense backend, counted (see the module docstring)."""
    COUNTERS.count_reference(VIA_GLOBAL)
    return _dense(_state, dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                                _parallel_config=_parallel_config))


@dataclass(frozen=True)
class AttentionBackendReport:
    """What the ``sol_attn`` attention backend did in this process since the last reset (all models together: the
    dispatcher passes the backend no module). ``dense_calls`` by reason; ``fallback_calls``: the subset under
    ``high`` where sparse was asked for but the call was not eligible."""

    registered: bool
    why_not_registered: Optional[str]
    sparse_calls: int
    dense_calls: dict
    fallback_calls: dict
    exact_fraction: Optional[float]
    config: dict
    uncounted: Optional[str] = None

    def __str__(self) -> str:
        if not self.registered:
            return f"sol_attn attention backend: not registered ({self.why_not_registered})"
        dense = ", ".join(f"{n}× {r}" for r, n in sorted(self.dense_calls.items(), key=lambda x: -x[1])) or "none"
        frac = f", exact-block fraction {self.exact_fraction:.3f}" if self.exact_fraction is not None else ""
        opts = " ".join(f"{k}={v}" for k, v in self.config.items())
        text = (f"sol_attn attention backend (set_attention_backend; process-wide, all models): "
                f"{self.sparse_calls} sparse calls{frac}; dense: {dense}; options: {opts}")
        return text + (f"; not counted: {self.uncounted}" if self.uncounted else "")

    __repr__ = __str__


def uses_sol_attn(models) -> bool:
    """Whether any attention processor of ``models`` is set to the ``sol_attn`` backend."""
    return any(getattr(getattr(module, "processor", None), "_attention_backend", None) == NAME
               for model in models for module in model.modules())

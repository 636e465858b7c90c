"""A hypothesis state machine that walks accelpatch's contract on tiny models of every family, looking for holes.

Rules: apply (random valid options: backend where the family has one, step cache, tier, strict; or the same
arguments again), remove (and patch again), calls under random tiers and denoising steps (also in another thread,
also next to a call in this one), training calls (backward after the tier block; gradient checkpointing toggled),
calls that a user's hook makes raise or interrupts (on an inner block, or on a layer inside an attention module),
foreign hooks attached at any time (accelerate's ``add_hook_to_module`` and ``remove_hook_from_module``, a
diffusers ``HookRegistry`` hook, ``m.forward = m.forward``), ``report(reset=True)``, ``copy.deepcopy`` and a
pickle round trip. Each example runs in a context of its own (a session), on deep copies of models built once per
process (:func:`pristine`), optionally under the test-only switch that runs CUDA-guarded fast paths on CPU.

Invariants, checked after every step, against a *twin*: an unpatched copy of the same weights that receives the same
foreign hooks, checkpointing and copies, never accelpatch:

* outside ``high`` (and at every tier once removed) outputs and gradients are ``torch.equal`` to the twin's;
* ``state_dict()`` never changes; unpatched (never patched, or after ``remove()``) the module tree is the twin's:
  classes, instance attributes and their types (no instance ``forward`` or accelpatch attribute left), hook dicts;
* per site, fast + reference calls in ``report()`` equal the site's invocations counted independently (a forward
  pre-hook on every module, registered before anything else; recomputations for backward are not calls; a site
  stacked below another on the same module is invoked by the upper one's reference calls; a block site is not
  invoked by a call whose step cache skipped the block, nor by one a user's pre-hook on it stopped; a block site
  around a site that raised, or around a user's hook that raised, stopped midway: counted or not); the step
  cache decides once per call that gets past its first block; the step sources add up to the calls;
* the tier outside any block is ``lossless`` and no denoising step is in force between calls;
* ``report().assert_fast_path_ran()`` raises exactly when no fast path ran (no fast call, no step-cache reuse);
* nothing raises that the user did not cause: only the user's own exception, or ``FastPathUnavailableError`` under
  ``strict=True`` where the tier asks for a fast path.

Holes found and tracked are named in :data:`KNOWN_HOLES`: unless ``check_known_holes`` is set, the machine leaves out
the invariant they break or does not walk the path into them. Each has an ``xfail(strict=True)`` regression test in
tests/test_contract_state_machine.py, so fixing a hole fails that test: then drop the xfail and the entry together.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import copy
import pickle
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.sol_attn.config import NOTHING_SKIPPED
from accelpatch.core.sites import NO_FUSED_OP, NO_FUSED_OP_COMPILED

#: reference-counted reasons of a call the site's own fast path ran (it did no fast work): not handed to the site below
RAN_HERE = {NOTHING_SKIPPED, NO_FUSED_OP, NO_FUSED_OP_COMPILED}

#: hole -> what it is; while listed, the machine skips the check or the path it breaks (see :func:`checks`)
KNOWN_HOLES = {
    "no_step_between_calls": "issue 16 item 4: after an interrupted call (KeyboardInterrupt) its step stays in force "
                             "between calls, until the model's next call closes it",
}


def checks(hole: str) -> bool:
    """Whether the invariant part named ``hole`` is checked in this run."""
    return ContractMachine.check_known_holes or hole not in KNOWN_HOLES


# --- the models ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Family:
    """How the machine builds, calls and hooks one model family."""

    name: str
    build: Callable[[torch.dtype], torch.nn.Module]
    #: (model, variant) -> forward kwargs; variants 0..3 run from the noisiest timestep to the cleanest
    inputs: Callable[[torch.nn.Module, int], dict]
    #: paths of the blocks a raising hook goes on, and of the attention modules foreign hooks go on
    blocks: Callable[[torch.nn.Module], list[str]]
    attention: Callable[[torch.nn.Module], list[str]]
    options: Callable[[Any], dict]  # hypothesis data -> apply() keyword arguments (without cache/tier/strict)
    cache_methods: tuple[str, ...] = ("first_block",)


def _sv_build(dtype):
    from accelpatch.testing import tiny_sana_video_transformer
    return tiny_sana_video_transformer(dtype=dtype)


def _sv_inputs(model, variant):
    from accelpatch.testing import sana_video_transformer_inputs
    inputs = sana_video_transformer_inputs(model)
    inputs["timestep"] = torch.full_like(inputs["timestep"], (900.0, 600.0, 300.0, 100.0)[variant])
    return inputs


def _sv2_build(dtype):
    from accelpatch.testing import tiny_sana_video2_transformer
    return tiny_sana_video2_transformer(dtype=dtype)


def _sv2_inputs(model, variant):
    from accelpatch.testing import sana_video2_transformer_inputs
    inputs = sana_video2_transformer_inputs(model)
    t = (950.0, 700.5, 400.25, 100.0)[variant]
    inputs["timestep"] = torch.tensor([t, t], device=inputs["timestep"].device)
    return inputs


def _h3_build(dtype):
    from accelpatch.testing import tiny_minimax_h3_transformer
    return tiny_minimax_h3_transformer(dtype=dtype)


def _h3_inputs(model, variant):
    from accelpatch.testing import minimax_h3_transformer_inputs
    video_t = (0.1, 0.4, 0.7, 0.9)[variant]  # H3 timesteps run from 0 (noise) to 1 (clean)
    return minimax_h3_transformer_inputs(model, num_video=96, video_timestep=video_t, audio_timestep=video_t)


_SOL_COMMON = dict(tau=st.sampled_from([-1e9, 0.5, 2.0]), thresh_type=st.sampled_from(["diag", "exact"]),
                   dense_steps=st.sampled_from([0, 1, 2, 10]), impl=st.sampled_from(["auto", "torch"]),
                   kv_splits=st.sampled_from([1, 2, "auto"]))


def _draw_some(data, strategies: dict) -> dict:
    """A random subset of the options, each with a random value (absent ones keep their defaults)."""
    return {name: data.draw(s, label=name) for name, s in strategies.items()
            if data.draw(st.booleans(), label=f"set {name}")}


def _sv_options(data):
    return {}


def _sv2_options(data):
    options = _draw_some(data, dict(anchor_fp32_steps=st.sampled_from([0, 1, 2, 10]),
                                    anchor_fp32_layers=st.sampled_from(["", "3"])))
    if data.draw(st.booleans(), label="sol_attn"):
        options["backend"] = "sol_attn"
        options.update(_draw_some(data, {**_SOL_COMMON, "dense_layers": st.sampled_from(["", "3"])}))
    return options


def _h3_options(data):
    if not data.draw(st.booleans(), label="sol_attn"):
        return {}
    return {"backend": "sol_attn",
            **_draw_some(data, {**_SOL_COMMON, "dense_layers": st.sampled_from(["", "0", "1", "0-1", (1,)])})}


FAMILIES = {
    "sana_video": Family("sana_video", _sv_build, _sv_inputs,
                         lambda m: [f"transformer_blocks.{i}" for i in range(len(m.transformer_blocks))],
                         lambda m: [f"transformer_blocks.{i}.attn1" for i in range(len(m.transformer_blocks))],
                         _sv_options, ("first_block", "mag")),
    "sana_video2": Family("sana_video2", _sv2_build, _sv2_inputs,
                          lambda m: [f"blocks.{i}" for i in range(len(m.blocks))],
                          lambda m: [f"blocks.{i}.attn" for i in range(len(m.blocks))],
                          _sv2_options),
    "minimax_h3": Family("minimax_h3", _h3_build, _h3_inputs,
                         lambda m: ([f"transformer_blocks.{i}" for i in range(len(m.transformer_blocks))]
                                    + [f"token_refiner.refiner_blocks.{i}"
                                       for i in range(len(m.token_refiner.refiner_blocks))]),
                         lambda m: ([f"transformer_blocks.{i}.attn" for i in range(len(m.transformer_blocks))]
                                    + [f"token_refiner.refiner_blocks.{i}.attn"
                                       for i in range(len(m.token_refiner.refiner_blocks))]),
                         _h3_options, ("first_block", "mag")),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

_PRISTINE: dict[tuple[str, str], tuple[torch.nn.Module, dict]] = {}


def pristine(family: str, dtype: str) -> tuple[torch.nn.Module, dict]:
    """The family's tiny model, built once per process and never patched, and a copy of its state dict."""
    key = (family, dtype)
    if key not in _PRISTINE:
        model = FAMILIES[family].build(DTYPES[dtype])
        _PRISTINE[key] = model, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return _PRISTINE[key]


# --- observing -----------------------------------------------------------------------------------------------

class Tally:
    """Invocations per module path, counted by :class:`CountCall` pre-hooks (thread-safe, copies with its model)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        #: set while the machine runs backward(): gradient checkpointing's recomputations are not calls (the
        #: docs/training.md: report() does not count them again)
        self.paused = False

    def add(self, path: str) -> None:
        if self.paused:
            return
        with self._lock:
            self.counts[path] += 1

    def snapshot(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self.counts)

    def __getstate__(self):
        return {"counts": self.snapshot()}

    def __setstate__(self, state):
        self.counts = state["counts"]
        self._lock = threading.Lock()
        self.paused = False


class CountCall:
    """A forward pre-hook counting one module's invocations (a class, so that it deep-copies and pickles)."""

    def __init__(self, tally: Tally, path: str) -> None:
        self.tally, self.path = tally, path

    def __call__(self, module, args):
        self.tally.add(self.path)


def count_invocations(model: torch.nn.Module) -> Tally:
    tally = Tally()
    for path, module in model.named_modules():
        module.register_forward_pre_hook(CountCall(tally, path))
    return tally


class UserError(Exception):
    """What a user's hook raises."""


class RaiseFrom:
    """A user's forward hook (pre or post) that raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self, module, *args):
        raise self.error


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs")


def _hook_name(hook) -> str:
    if isinstance(hook, bool):
        return str(hook)
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def module_tree(model: torch.nn.Module) -> dict:
    """What remove() must restore, per module path: class, instance attribute names, hooks (by kind and name)."""
    return {path: (type(m), sorted((k, type(v).__name__) for k, v in vars(m).items()), m.training,
                   tuple((name, tuple(map(_hook_name, getattr(m, name).values()))) for name in _HOOK_DICTS))
            for path, m in model.named_modules()}


def accelpatch_leftovers(model: torch.nn.Module) -> list[str]:
    return [f"{path or '<root>'}.{key}" for path, m in model.named_modules() for key in vars(m)
            if "accelpatch" in key or key.startswith("_sgl")]


def outputs_of(out) -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {"out": out}
    if isinstance(out, tuple):
        return {str(i): t for i, t in enumerate(out) if isinstance(t, torch.Tensor)}
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


# --- foreign hooks -------------------------------------------------------------------------------------------

def _accelerate(module, append=False):
    from accelerate.hooks import ModelHook, add_hook_to_module
    add_hook_to_module(module, ModelHook(), append=append)


def _accelerate_remove(module):
    from accelerate.hooks import remove_hook_from_module
    remove_hook_from_module(module)


def _rebind(module):
    module.forward = module.forward


def _diffusers(module):
    from diffusers.hooks import HookRegistry, ModelHook
    registry = HookRegistry.check_if_exists_or_initialize(module)
    registry.register_hook(ModelHook(), f"user_{len(registry.hooks)}")


FOREIGN_HOOKS = {"accelerate": _accelerate, "accelerate_append": lambda m: _accelerate(m, append=True),
                 "accelerate_remove": _accelerate_remove, "rebind": _rebind, "diffusers": _diffusers}


# --- the machine ---------------------------------------------------------------------------------------------

_STRICT_PATH = re.compile(r" at (\S+) could not run")
TIERS = st.sampled_from([None, "exact", "lossless", "high"])
STEPS = st.one_of(st.none(), st.integers(0, 12))
VARIANTS = st.integers(0, 3)


class ContractMachine(RuleBasedStateMachine):
    """See the module docstring. Class attributes set by the runner: ``families`` (names to draw from),
    ``check_known_holes``; ``examples`` counts machines run in this process."""

    families: tuple[str, ...] = tuple(FAMILIES)
    check_known_holes = False
    examples = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self._cpu_switch = None

    # --- set-up ---

    @initialize(data=st.data())
    def start(self, data):
        family = data.draw(st.sampled_from(self.families), label="family")
        dtype = data.draw(st.sampled_from(sorted(DTYPES)), label="dtype")
        cpu_fast_paths = data.draw(st.booleans(), label="run_fast_paths_on_cpu")
        self.family = FAMILIES[family]
        base, self.pristine_state = pristine(family, dtype)
        self.model, self.twin = copy.deepcopy(base), copy.deepcopy(base)
        self.tally = count_invocations(self.model)
        count_invocations(self.twin)  # the same hooks on both, so their module trees compare
        if cpu_fast_paths:  # the test-only switch: fast paths whose guards want CUDA run their CPU emulation
            self._cpu_switch = run_fast_paths_on_cpu()
            self._cpu_switch.__enter__()
        #: the example's own context (a user's session, a notebook kernel): what one call leaves in it stays for the
        #: next, and nothing leaks into the next example or test
        self.session = contextvars.Context()
        self.kwargs: Optional[dict] = None  # the apply() arguments in force, None while unpatched
        self._twin_outputs: dict[tuple[int, bool], dict] = {}  # (variant, backward) -> the twin's outputs
        self._start_counting()
        if data.draw(st.booleans(), label="apply first"):  # most paths are worth walking patched
            self.apply(data)

    def teardown(self) -> None:
        if self._cpu_switch is not None:
            self._cpu_switch.__exit__(None, None, None)

    def _start_counting(self) -> None:
        """Counters start from zero here (apply with new arguments, report(reset=True))."""
        self.base = self.tally.snapshot()
        self.uncounted: collections.Counter[str] = collections.Counter()  # site calls a strict raise cut short
        #: site calls that a user's error inside the site stopped midway (a fast call that raised is not counted, a
        #: reference call is counted before it runs): counted or not
        self.slack: collections.Counter[str] = collections.Counter()
        self.calls_completed = 0

    # --- helpers ---

    def _default_tier(self) -> Optional[str]:
        if self.kwargs is None:
            return None
        return self.kwargs.get("tier") or ("high" if self.kwargs.get("backend") else "lossless")

    def _tier_of_call(self, tier: Optional[str]) -> str:
        """The tier the model runs a call under (the rule of docs/tiers.md), 'exact' when unpatched."""
        if self.kwargs is None:
            return "exact"
        return tier or self._default_tier()

    def _twin_output(self, variant: int, backward: bool = False) -> dict:
        key = (variant, backward)
        if key not in self._twin_outputs:
            self._twin_outputs[key] = _run(self.twin, self.family.inputs(self.twin, variant), None, None, backward,
                                           None)
        return self._twin_outputs[key]

    def _call(self, variant: int, tier: Optional[str], step: Optional[int], *, in_session: bool = True,
              backward: bool = False):
        """One forward of the model under ``tier``/``step`` (with ``backward``: and a backward outside them), in the
        session's context (else in the calling thread's own); returns (outputs and gradients, or None; the
        exception or None)."""
        if in_session:
            return self.session.run(self._call, variant, tier, step, in_session=False, backward=backward)
        try:
            return _run(self.model, self.family.inputs(self.model, variant), tier, step, backward, self.tally), None
        except BaseException as error:  # noqa: BLE001 - judged by _judge
            return None, error

    def _site_paths(self) -> set[str]:
        """The paths of the model's sites (none when unpatched)."""
        return {s.path for s in accelpatch.report(self.model).sites} if self.kwargs is not None else set()

    def _enclosing_sites(self, path: str) -> set[str]:
        """The site paths strictly above ``path`` in the module tree (a lossless block site around an attention)."""
        return {p for p in self._site_paths() if path.startswith(p + ".")}

    def _reused(self) -> int:
        """Calls whose remaining blocks the model's step cache reused so far (0 without one)."""
        report = accelpatch.report(self.model)
        cache = report.models[0].cache if report.models else None
        return cache["reused"] if cache else 0

    def _judge(self, variant, tier, outputs, error, expected_error=None, backward=False) -> None:
        """Check one call's result: the output against the twin outside high, the error against what the user
        caused."""
        runs_at = self._tier_of_call(tier)
        if error is not None:
            if error is expected_error:
                return
            if (isinstance(error, accelpatch.FastPathUnavailableError) and self.kwargs is not None
                    and self.kwargs.get("strict") and runs_at == "high"):
                match = _STRICT_PATH.search(str(error))
                assert match, f"strict error names no site: {error}"
                self.uncounted[match.group(1)] += 1
                for site_path in self._enclosing_sites(match.group(1)):  # a block site around it stopped midway
                    self.slack[site_path] += 1
                return
            raise AssertionError(f"a call under tier={tier} raised what the user did not cause "
                                 f"(expected {expected_error!r}): {type(error).__name__}: {error}") from error
        assert expected_error is None, f"the user's {expected_error!r} did not propagate"
        self.calls_completed += 1
        twin = self._twin_output(variant, backward)
        exact = runs_at != "high" or self.kwargs is None
        if exact:  # under high a reused step cache leaves the skipped blocks without gradients
            assert outputs.keys() == twin.keys(), sorted(set(outputs.keys()) ^ set(twin.keys()))[:5]
        else:
            assert not outputs.keys() - twin.keys(), sorted(outputs.keys() - twin.keys())[:5]
        for name, value in outputs.items():
            assert value.shape == twin[name].shape and value.dtype == twin[name].dtype, name
            if exact:
                assert torch.equal(value, twin[name]), (
                    f"output {name!r} at tier {runs_at} differs from the unpatched twin "
                    f"(max |diff| {(value.float() - twin[name].float()).abs().max().item():.3g})")

    def _both(self, action: Callable[[torch.nn.Module], Any]) -> None:
        """Do the same foreign thing to the model and to its twin."""
        action(self.model)
        action(self.twin)
        self._twin_outputs.clear()

    # --- rules ---

    @rule(data=st.data())
    def apply(self, data):
        """apply() with random valid options, or (patched) the same arguments again, which does nothing."""
        if self.kwargs is not None and data.draw(st.booleans(), label="the same arguments again"):
            return self._apply(dict(self.kwargs))
        kwargs = self.family.options(data)
        if data.draw(st.booleans(), label="cache"):
            method = data.draw(st.sampled_from(self.family.cache_methods), label="cache method")
            kwargs["cache"] = method  # "mag": a MagCacheConfig made at each apply (see _apply)
            kwargs.update(_draw_some(data, dict(cache_threshold=st.sampled_from([0.0, 0.05, 1e9]),
                                                cache_warmup_steps=st.sampled_from([0, 1, 2]),
                                                cache_max_reuse=st.sampled_from([1, 2, 3]),
                                                cache_final_steps=st.sampled_from([0, 1]))))
        kwargs["tier"] = data.draw(TIERS, label="tier")
        kwargs["strict"] = data.draw(st.booleans(), label="strict")
        self._apply(kwargs)

    def _apply(self, kwargs: dict) -> None:
        same = kwargs == self.kwargs  # docs/contract.md: the same arguments again do nothing
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            given = {k: v for k, v in kwargs.items() if v is not None}
            if given.get("cache") == "mag":  # ratios of 1: MagCache's error stays 0, it skips when allowed
                from diffusers import MagCacheConfig
                given["cache"] = MagCacheConfig(mag_ratios=[1.0] * 16, num_inference_steps=16, retention_ratio=0.0)
            try:
                self.session.run(accelpatch.apply, self.model, **given)
            except accelpatch.FastPathUnavailableError as error:
                # strict refuses, before touching the model, options under which a fast path can never run
                assert given.get("strict") and "can never run" in str(error), error
                return
        self.kwargs = kwargs
        if not same:  # other arguments re-patch the model and start its counters from zero
            self._start_counting()

    @rule(patch_again=st.booleans())
    def remove(self, patch_again):
        """remove(); with ``patch_again`` the same apply() right after (a fresh patch: counters from zero)."""
        kwargs = self.kwargs
        self.session.run(accelpatch.remove, self.model)
        self.kwargs = None
        if patch_again and kwargs is not None:
            self.unpatched_is_the_twin()  # what remove() left, before apply() changes it again
            self._apply(kwargs)

    @rule(variant=VARIANTS, tier=TIERS, step=STEPS)
    def call(self, variant, tier, step):
        outputs, error = self._call(variant, tier, step)
        self._judge(variant, tier, outputs, error)

    @rule(variant=VARIANTS, tier=TIERS, step=STEPS)
    def call_and_backward(self, variant, tier, step):
        """A training step: forward under the tier and step, backward after them (gradients compared too)."""
        if self.kwargs is not None and self.kwargs.get("cache") and not checks("cache_reuse_keeps_the_graph"):
            return
        outputs, error = self._call(variant, tier, step, backward=True)
        self._judge(variant, tier, outputs, error, backward=True)

    @rule(on=st.booleans())
    def gradient_checkpointing(self, on):
        self._both(lambda m: m.enable_gradient_checkpointing() if on else m.disable_gradient_checkpointing())

    @rule(variant=VARIANTS, tier=TIERS, step=STEPS, data=st.data())
    def call_that_a_hook_makes_raise(self, variant, tier, step, data):
        """A user's hook raises (or interrupts) on an inner block, or on a layer inside an attention module."""
        if self.kwargs is not None and self.kwargs.get("cache") and not checks("cache_reuses_after_a_raised_call"):
            return
        inner = {f"{a}.{name}": a for a in self.family.attention(self.model)  # layer -> its attention module
                 for name, m in self.model.get_submodule(a).named_modules() if name and not list(m.children())}
        path = data.draw(st.sampled_from(self.family.blocks(self.model) + sorted(inner)), label="module")
        kind = data.draw(st.sampled_from(["pre", "post"]), label="hook")
        error = data.draw(st.sampled_from([UserError, KeyboardInterrupt]), label="error")("raised by a user hook")
        block = self.model.get_submodule(path)
        handle = (block.register_forward_pre_hook if kind == "pre" else block.register_forward_hook)(RaiseFrom(error))
        reused = self._reused()
        try:
            outputs, raised = self._call(variant, tier, step)
        finally:
            handle.remove()
        # the step cache reused the blocks after the first: a hook inside them never ran
        expected = None if raised is None and self._reused() > reused else error
        try:
            self._judge(variant, tier, outputs, raised, expected_error=expected)
        finally:
            error.__traceback__ = None  # frames would keep the models alive
        if raised is error:  # the sites around it stopped midway: counted or not, both are fine
            for site_path in self._enclosing_sites(path) | ({inner[path]} if path in inner else set()):
                self.slack[site_path] += 1
        if raised is error and kind == "pre" and path in self._site_paths():
            # the block is a site itself (a lossless one): the counting pre-hook saw the call, the user's pre-hook
            # raised before the gate, so no site on it ran or counted it
            self.uncounted[path] += 1

    @rule(variant=VARIANTS, tier=TIERS, step=STEPS, also_here=st.one_of(st.none(), st.tuples(VARIANTS, TIERS)))
    def call_in_a_thread(self, variant, tier, step, also_here):
        """A call in another thread (its own context: no tier or step of this one), optionally while this thread
        runs a call of its own."""
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=self._call(variant, tier, step, in_session=False)))
        thread.start()
        here = self._call(also_here[0], also_here[1], None) if also_here is not None else None
        thread.join()
        self._judge(variant, tier, *result["r"])
        if here is not None:
            self._judge(also_here[0], also_here[1], *here)

    @rule(kind=st.sampled_from(sorted(FOREIGN_HOOKS)), data=st.data())
    def attach_foreign_hook(self, kind, data):
        paths = [""] + self.family.blocks(self.model) + self.family.attention(self.model)
        if kind == "diffusers":  # a diffusers hook on a block next to the step cache's is a documented limit
            paths = self.family.attention(self.model)
        elif (kind.startswith("accelerate") and self.kwargs is not None and self.kwargs.get("cache")
              and not checks("cache_remove_drops_accelerate_hook")):
            paths = [p for p in paths if p not in self.family.blocks(self.model)]
        path = data.draw(st.sampled_from(paths), label="module")
        self._both(lambda m: FOREIGN_HOOKS[kind](m.get_submodule(path)))

    @precondition(lambda self: self.kwargs is not None)
    @rule(render_first=st.booleans())
    def reset_report(self, render_first):
        """report(reset=True): counters from zero (reading a report, as text or HTML, changes nothing)."""
        if render_first:
            report = accelpatch.report(self.model)
            str(report), report._repr_html_()
        accelpatch.report(self.model, reset=True)
        self._start_counting()

    @rule(how=st.sampled_from(["deepcopy", "pickle"]))
    def copy_model(self, how):
        """Continue with copies of the model and its twin: deep copies, or a pickle round trip where the unpatched
        twin pickles (foreign hooks' closures do not). A copy keeps its counters, so the bookkeeping carries over.
        No deep copy of a model carrying a user's diffusers hook: diffusers' hooked forward is a closure over the
        original module, so the copy would call the original (the unpatched twin's too)."""
        if how == "deepcopy":
            if any("_diffusers_hook" in vars(m) for m in self.twin.modules()):
                return
            model, twin = copy.deepcopy(self.model), copy.deepcopy(self.twin)
        else:
            try:
                twin = pickle.loads(pickle.dumps(self.twin))
            except (pickle.PicklingError, AttributeError, TypeError):
                return
            model = pickle.loads(pickle.dumps(self.model))
        self.model, self.twin = model, twin
        self.tally = next(h.tally for h in model._forward_pre_hooks.values() if isinstance(h, CountCall))
        self._twin_outputs.clear()

    # --- invariants ---

    @invariant()
    def state_dict_never_changes(self):
        state = self.model.state_dict()
        assert state.keys() == self.pristine_state.keys()
        changed = [k for k, v in state.items() if not torch.equal(v, self.pristine_state[k])]
        assert not changed, f"state_dict values changed: {changed[:5]}"

    @invariant()
    def unpatched_is_the_twin(self):
        if self.kwargs is not None:
            return
        mine, twins = module_tree(self.model), module_tree(self.twin)
        registry = self.model.__dict__.get("_diffusers_hook")
        if (not checks("mag_cache_remove_leaves_root_registry") and registry is not None and not registry.hooks
                and "_diffusers_hook" not in vars(self.twin)):
            cls, keys, training, hooks = mine[""]
            mine[""] = cls, [k for k in keys if k[0] != "_diffusers_hook"], training, hooks
        for path, module in self.twin.named_modules():  # ``m.forward = m.forward`` on the twin, where on the model
            forward = vars(module).get("forward")       # it rebound the step cache's wrapper: the same either way
            if (getattr(forward, "__func__", None) is type(module).forward and path in mine
                    and "forward" not in vars(self.model.get_submodule(path))):
                cls, keys, training, hooks = mine[path]
                mine[path] = cls, sorted(keys + [("forward", "method")]), training, hooks
        diff = [(p, mine.get(p), twins.get(p)) for p in sorted(set(mine) | set(twins)) if mine.get(p) != twins.get(p)]
        assert not diff, f"unpatched model differs from its twin at {diff[:3]}"
        assert not accelpatch_leftovers(self.model), accelpatch_leftovers(self.model)
        assert accelpatch.report(self.model).models == ()
        assert self.session.run(accelpatch.current_quality, self.model) == "exact"

    @invariant()
    def outside_calls_nothing_is_in_force(self):
        assert self.session.run(accelpatch.current_quality) == "lossless"
        if checks("no_step_between_calls"):
            from accelpatch.core import steps
            reading = self.session.run(steps.current_step)
            assert reading.step is None, f"between calls a step is still in force: {reading}"

    @invariant()
    def counts_add_up(self):
        if self.kwargs is None:
            return
        report = accelpatch.report(self.model)
        (model_report,) = report.models
        assert model_report.default_tier == self._default_tier()
        str(report), report._repr_html_(), report.to_dict()  # renders without raising
        assert self.session.run(accelpatch.current_quality, self.model) == self._default_tier()
        seen = self.tally.snapshot()
        # a call whose blocks the step cache reused still calls each skipped block module (the counting pre-hook
        # sees it), but diffusers' cache hook returns before the block's forward: a block site never runs for it
        # (MagCache skips every block, the first-block cache the blocks after the first)
        reused = (model_report.cache or {}).get("reused", 0)
        blocks = self.family.blocks(self.model)
        skipped = set(blocks if self.kwargs.get("cache") == "mag" else blocks[1:]) if reused else set()
        passed_down: dict[str, int] = {}  # stacked sites (one module, highest tier first): what the upper passed on
        for site in model_report.sites:
            if site.path in passed_down:
                invoked = passed_down[site.path]
            else:
                invoked = seen[site.path] - self.base[site.path] - self.uncounted[site.path]
                invoked -= reused if site.path in skipped else 0
            counted = site.fast_calls + sum(site.reference_calls.values())
            passed_down[site.path] = sum(n for r, n in site.reference_calls.items() if r not in RAN_HERE)
            assert invoked - self.slack[site.path] <= counted <= invoked, (
                f"{site.path}: report counts {site.fast_calls} fast + {site.reference_calls} reference calls, the "
                f"site ran {invoked} times ({self.slack[site.path]} of them stopped midway by a user's error)")
            for reason, n in site.fallback_calls.items():
                assert n <= site.reference_calls.get(reason, 0), (site.path, reason)
        calls = seen[""] - self.base[""]
        if model_report.cache is not None:
            decided = model_report.cache["computed"] + model_report.cache["reused"]
            assert self.calls_completed <= decided <= calls, (
                f"the step cache decided {decided} times for {self.calls_completed} completed of {calls} calls")
        if model_report.step_sources:
            assert sum(model_report.step_sources.values()) == calls, (model_report.step_sources, calls)
        if checks("fast_path_ran_counts_cache_reuse"):
            ran = report.fast_calls > 0 or (model_report.cache or {}).get("reused", 0) > 0
            try:
                report.assert_fast_path_ran()
                said_ran = True
            except AssertionError:
                said_ran = False
            assert said_ran == ran, f"assert_fast_path_ran() says {said_ran}, fast paths ran: {ran}"


def _run(model, inputs, tier, step, backward: bool, tally: Optional[Tally]) -> dict:
    """``model(**inputs)`` under ``tier``/``step``; its output tensors, and with ``backward`` the parameters'
    gradients of the outputs' sum (backward runs after the tier and step blocks closed, uncounted)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(torch.enable_grad() if backward else torch.no_grad())
        with contextlib.ExitStack() as call:
            if tier is not None:
                call.enter_context(accelpatch.quality(tier))
            if step is not None:
                call.enter_context(accelpatch.denoising_step(step))
            outputs = outputs_of(model(**inputs))
        if not backward:
            return outputs
        model.zero_grad(set_to_none=True)
        if tally is not None:
            tally.paused = True
        try:
            sum(o.float().sum() for o in outputs.values()).backward()
        finally:
            if tally is not None:
                tally.paused = False
        grads = {f"grad {name}": p.grad for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return {**{k: v.detach() for k, v in outputs.items()}, **grads}

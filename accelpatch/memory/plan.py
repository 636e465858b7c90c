"""A call's peak memory by stage, planned at full size on a CPU in seconds (issue #44): :func:`memory_plan`.

Each stage's model is built at its release configuration inside ``FakeTensorMode`` (shapes, no storage: nothing is
downloaded and no math runs) and called once on inputs of the call's shapes, while
:class:`~accelpatch.memory.live_bytes.LiveBytes` counts the live tensor bytes. A stage is its weights plus the peak of
its activations (its inputs included). The transformer step is planned unpatched and patched (``accelpatch.apply``
with the recipe's tier, backend and options, inside the same fake mode); a stage whose release configuration is not
known is listed as not planned, with the reason, never as zero.

How pixels become latents, text tokens and the CFG batch is read from each family's diffusers pipeline and kept
with the family: its :class:`~accelpatch.models.families.MemorySettings`, registered by its package, with the few
functions where it differs from the generic rule here in ``accelpatch.models.<key>.memory``. The inputs come from
:mod:`accelpatch.testing`'s per-family builders, so the tests can run the same step for real at a tiny size and
compare the bytes. This module names no family.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from accelpatch.core.tiers import Tier
from accelpatch.memory.gguf_weights import GGUF_TYPES, by_type, file_types
from accelpatch.memory.quantised import TORCHAO_CONFIGS, torchao_quantised
from accelpatch.memory.sizes import gib, parse_size
from accelpatch.models.families import MemorySettings, families, resolve

__all__ = ["memory_plan", "MemoryPlan", "Move", "Stage", "TransformerCase", "trace_step", "trace_vae_decode",
           "trace_vae_encode",
           "family_of", "release_config", "memory_settings", "group_offload_resident"]

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: the tiers a plan's patched step can be traced at (accelpatch.core.tiers.Tier, by name)
TIERS = tuple(str(tier) for tier in Tier)



def _planned() -> list:
    """The families with memory settings, in the order their names are tried."""
    return sorted((f for f in families() if f.memory is not None), key=lambda f: (f.memory.name_order, f.key))


def memory_settings(family: str) -> MemorySettings:
    """The :class:`MemorySettings` the family ``family`` (a key) registered; ValueError naming it when it has none."""
    found = next((f for f in families() if f.key == family), None)
    if found is None or found.memory is None:
        raise ValueError(f"no memory settings for family {family!r}: the planner plans "
                         f"{', '.join(f.key for f in _planned())}")
    return found.memory


def _normal(name: str) -> str:
    return str(name).lower().replace("_", "-")


def family_of(model: str) -> Optional[str]:
    """The family key a model name (hub id, folder) belongs to, by the words in it (the families' ``names``, tried
    in their ``name_order``); None when none matches."""
    name = _normal(model)
    return next((f.key for f in _planned() if any(w in name for w in f.memory.names)), None)


def release_config(family: str, model: str) -> Union[tuple[dict, str], str]:
    """(the transformer's release configuration, where it comes from) for ``model``, or why none is known."""
    known = resolve(memory_settings(family).release_config)(_normal(model))
    if known is None:
        return (f"no release configuration of {model!r} is known here (accelpatch.testing, diffusers' class defaults "
                "and ../shared/reference hold none for it)")
    if isinstance(known, str):
        return known
    config, source = known
    if isinstance(config, str):  # a configuration of the family's accelpatch.testing module, by name
        config = getattr(_testing(family), config)
    return dict(config), source


def _testing(family: str):
    """The family's tiny builders and configurations, ``accelpatch.testing.<key>`` (the naming convention)."""
    return importlib.import_module(f"accelpatch.testing.{family}")


@dataclass(frozen=True)
class TransformerCase:
    """One transformer step to plan (fake tensors) or measure (real ones): the family (a key), its configuration,
    the latent grid (frames, height, width in VAE latents, before the patch), the text tokens, the batch (CFG
    included) and the dtype. ``audio``: what the transformer sees of audio beside the video, in the family's
    ``audio_unit`` (0: none)."""

    family: str
    config: Mapping[str, Any]
    frames: int
    height: int
    width: int
    text_tokens: int
    batch: int = 1
    audio: int = 0
    dtype: Any = "bfloat16"
    #: a second text stream's tokens and the image tokens, for a family whose transformer takes them
    glyph_tokens: int = 256
    image_tokens: int = 729

    def build(self):
        """The transformer as from_pretrained(torch_dtype=...) leaves it (the modules diffusers keeps in float32 stay
        float32), its weights random. Not ``.to()``: a fake module's parameters cannot be swapped."""
        from accelpatch.memory.components import build_component

        return build_component(resolve(memory_settings(self.family).transformer), self.config, self.dtype)

    def meta_model(self):
        """:meth:`build` on the meta device (no storage, no initialisation cost): what the weighings of offloading,
        fp8 storage and torchao read; each gets its own, since casting and quantising change the model they weigh."""
        import torch

        with torch.device("meta"):
            return self.build()

    @property
    def torch_dtype(self):
        from accelpatch.memory.components import torch_dtype

        return torch_dtype(self.dtype)

    def inputs(self, model) -> dict[str, Any]:
        """The keyword arguments of one forward, from the family's builder in :mod:`accelpatch.testing`."""
        make = getattr(_testing(self.family), f"{self.family}_transformer_inputs")
        return make(model, **resolve(memory_settings(self.family).transformer_inputs)(self))


@dataclass(frozen=True)
class StepTrace:
    """What one traced (or measured) transformer step holds: its weights, its inputs and the peak of what it
    creates (:class:`LiveBytes`), the step at which that peak came, and apply()'s report when patched."""

    weights: int
    inputs: int
    created: int
    parameters: int = 0
    step: Optional[int] = None
    report: str = ""
    #: what the patched model's first call creates, when traced: each fused op's first sight checks it against its
    #: eager chain (an out-of-place op's results hashed and freed before its kernel runs; an in-place op's beside
    #: the input it overwrites) (None: not traced)
    first_created: Optional[int] = None
    #: where the (steady) peak came: the innermost module and the operator, on a fake trace ("" on a real run)
    peak_at: str = ""
    #: where the first call's peak came (a fake trace)
    first_at: str = ""
    #: with ``trace_step(linears=True)``: each linear layer's call of the forward kept (name, weight shape, bytes
    #: created and alive when it started, its output's bytes)
    linear_calls: tuple = ()

    @property
    def activations(self) -> int:
        return self.inputs + self.created

    @property
    def first_activations(self) -> Optional[int]:
        return None if self.first_created is None else self.inputs + self.first_created


def trace_step(case: TransformerCase, *, fake: bool = True, apply_arguments: Optional[Mapping[str, Any]] = None,
               steps: tuple = (None,), total_steps: Optional[int] = None, warmup: bool = False,
               linears: bool = False) -> StepTrace:
    """One forward of ``case``'s transformer under :class:`LiveBytes`: on fake tensors (the plan) or real ones (the
    check). ``apply_arguments``: patch it first with ``accelpatch.apply(model, **apply_arguments)``. ``steps``: the
    denoising steps to run it as (``accelpatch.denoising_step``; None: no step), the largest peak kept.
    ``warmup``: one call first, measured apart as the first call (a real patched model checks each fused op against
    its eager chain on first sight, see :meth:`~accelpatch.lossless.verify.FusedOp._first_sight`); a patched plan on fake tensors traces that first call
    too (:func:`~accelpatch.lossless.verify.traced_first_call`), then the steady calls after it. ``linears``: also
    record each linear layer's call (:func:`~accelpatch.memory.live_bytes.linear_calls`) of the forward kept, for
    the GGUF figures (:func:`gguf_weights`)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import accelpatch
    from accelpatch.lossless.verify import traced_first_call
    from accelpatch.memory.live_bytes import LiveBytes, linear_calls, module_bytes, storage_bytes
    from accelpatch.memory.shadows import ValueShadows

    mode = FakeTensorMode() if fake else None
    with mode or contextlib.nullcontext():
        model = case.build()
    inputs = case.inputs(model)  # real tensors (layout builders index and sort), made fake below
    input_bytes = storage_bytes(v for v in inputs.values() if isinstance(v, torch.Tensor))
    best = None
    with contextlib.ExitStack() as stack:
        if fake:
            stack.enter_context(mode)
            shadows = stack.enter_context(ValueShadows(mode))
            real, inputs = inputs, {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                                    for k, v in inputs.items()}
            for name, value in real.items():
                if isinstance(value, torch.Tensor):
                    shadows.know(inputs[name], value)
        if apply_arguments is not None:
            accelpatch.apply(model, **dict(apply_arguments))
        weights = module_bytes(model)
        parameters = sum(p.numel() for p in model.parameters())
        first_call = warmup or (fake and apply_arguments is not None)
        first, first_at = None, ""
        for step in ([steps[0]] if first_call else []) + list(steps):
            clock = contextlib.nullcontext() if step is None else accelpatch.denoising_step(step, total_steps)
            checks = traced_first_call() if fake and first is None and first_call else contextlib.nullcontext()
            with torch.no_grad(), clock, checks, LiveBytes(modules=fake) as live, (
                    linear_calls(live, model) if linears else contextlib.nullcontext([])) as calls:
                model(**inputs)
            if first_call and first is None:
                first, first_at = live.peak, _where(live)
            elif best is None or live.peak > best[0]:
                best = (live.peak, step, _where(live), tuple(calls))
        report = str(accelpatch.report(model)) if apply_arguments is not None else ""
    return StepTrace(weights, input_bytes, best[0], parameters, best[1], report, first, best[2], first_at, best[3])


def _where(live) -> str:
    """Where a traced peak came: the innermost module (without the model's class name) and the operator."""
    module = live.peak_module.partition(".")[2] or live.peak_module
    op = live.peak_op.removeprefix("aten.").removesuffix(".default")
    return f"{module} ({op})" if module else op


def torchao_weights(case: TransformerCase, kind: str) -> Union[tuple[int, int], str]:
    """:func:`~accelpatch.memory.quantised.torchao_quantised` of ``case``'s transformer (built on the meta device
    as ``from_pretrained(torch_dtype=...)`` leaves it): its bytes quantised and its one dequantised temporary."""
    return torchao_quantised(case.meta_model(), kind)


def gguf_weights(case: TransformerCase, types: Union[str, os.PathLike],
                 plain: StepTrace) -> Union[tuple[int, int], str]:
    """(the bytes of ``case``'s transformer loaded from GGUF, what its step holds more than ``plain``'s: the
    moment its layers' dequantisation raises the peak most), or why not. ``types``: a GGUF type ("Q4_K": every
    linear weight in it, :func:`~accelpatch.memory.gguf_weights.by_type`) or a GGUF file's path
    (:func:`~accelpatch.memory.gguf_weights.file_types`: its own types and bytes, read from its header); ``plain``:
    the unpatched step traced with ``linears=True``."""
    from accelpatch.memory.gguf_weights import dequantise_extra, type_weights

    model = case.meta_model()
    is_file = not isinstance(types, str) or types.endswith(".gguf")
    found = file_types(types, model, case.torch_dtype) if is_file else by_type(types)
    if isinstance(found, str):
        return found
    layers, weights = found if is_file else (found, type_weights(model, found))
    return weights, dequantise_extra(plain.linear_calls, plain.created, model, layers, case.torch_dtype)


def layerwise_fp8_weights(case: TransformerCase) -> int:
    """The bytes of ``case``'s transformer with its weights stored in fp8 by diffusers' own
    ``enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn)`` (its default skips: norms, embeddings, the
    patch and output projections stay in the compute dtype): the model built on the meta device, where casting
    allocates nothing."""
    import torch

    from accelpatch.memory.live_bytes import module_bytes

    model = case.meta_model()
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=case.torch_dtype)
    return module_bytes(model)


def group_offload_resident(model, *, stream: bool = True) -> int:
    """The bytes of ``model``'s weights on the device while it runs under diffusers' block-level group offloading,
    one block per group (``enable_group_offload(onload_device, offload_type="block_level", num_blocks_per_group=1,
    use_stream=stream)``): every top-level child that is not a ModuleList or Sequential, and the model's own
    parameters and buffers, form one group on the device for the whole forward; the blocks come one at a time, and
    with ``use_stream`` the next block is prefetched beside the running one."""
    import torch

    from accelpatch.memory.live_bytes import module_bytes, storage_bytes

    blocks, rest = [], 0
    for child in model.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            blocks += [module_bytes(block) for block in child]
        else:
            rest += module_bytes(child)
    rest += storage_bytes([*model.parameters(recurse=False), *model.buffers(recurse=False)])
    pairs = [a + b for a, b in zip(blocks, blocks[1:])] if stream else []
    return rest + max(pairs or blocks or [0])


def group_offload_weights(case: TransformerCase) -> int:
    """:func:`group_offload_resident` of ``case``'s transformer with streams (the model built on the meta device)."""
    return group_offload_resident(case.meta_model())


def trace_vae_decode(class_name: str, config: Mapping[str, Any], grid: tuple[int, int, int], *, batch: int,
                     dtype: str, tiling: Union[bool, Mapping[str, Any]] = False, fake: bool = True,
                     repeated: Sequence[str] = (), stand_ins: Sequence[tuple[str, str]] = (),
                     notes: Optional[list] = None, slicing: bool = False) -> tuple[int, int, int]:
    """(weights, activations, latent channels) of ``vae.decode`` of one batch of latents of ``grid`` (frames,
    height, width), traced on fake tensors (``fake=False``: run for real, the check at a tiny size); activations
    count the latents and what the decode creates. ``tiling``: decode with ``vae.enable_tiling()`` (True: diffusers'
    default tiles; a mapping: its arguments); ``slicing``: with ``vae.enable_slicing()`` (a batch decoded one video at
    a time, the decoded ones held). ``repeated`` and ``stand_ins``: see
    :class:`~accelpatch.models.families.VaeDecodeCase` (they shorten only a fake trace); ``notes`` gets the reasons of
    stand-ins left out."""
    import torch

    from accelpatch.memory.components import torch_dtype, trace_mode
    from accelpatch.memory.live_bytes import LiveBytes, module_bytes
    from accelpatch.memory.repeats import RepeatedCalls, submodules
    from accelpatch.memory.stand_ins import standing_in

    with trace_mode(fake), standing_in(stand_ins) as skipped:
        if notes is not None:
            notes.extend(skipped)
        vae = _vae(class_name, config, dtype, tiling)
        if slicing:
            vae.enable_slicing()
        channels = int(getattr(vae.config, "latent_channels", None) or vae.config.z_dim)
        latents = torch.zeros(batch, channels, *grid, dtype=torch_dtype(dtype))
        with torch.no_grad(), LiveBytes() as live, RepeatedCalls(live, submodules(vae, repeated)):
            vae.decode(latents, return_dict=False)
        return module_bytes(vae), live.peak + latents.untyped_storage().nbytes(), channels


def _vae(class_name: str, config: Mapping[str, Any], dtype: str, tiling: Union[bool, Mapping[str, Any]]):
    """diffusers' VAE class ``class_name`` built as from_pretrained(torch_dtype=...) leaves it, with
    ``vae.enable_tiling()`` where ``tiling`` asks (True: diffusers' default tiles; a mapping: its arguments)."""
    import diffusers

    from accelpatch.memory.components import build_component

    vae = build_component(getattr(diffusers, class_name), config, dtype)
    if tiling:
        vae.enable_tiling(**(dict(tiling) if isinstance(tiling, Mapping) else {}))
    return vae


def trace_vae_encode(class_name: str, config: Mapping[str, Any], size: tuple[int, int, int], *, batch: int,
                     dtype: str, tiling: Union[bool, Mapping[str, Any]] = False, fake: bool = True,
                     repeated: Sequence[str] = ()) -> tuple[int, int]:
    """(weights, activations) of ``vae.encode`` of ``batch`` videos of ``size`` (frames, height, width in pixels),
    as an image-to-video pipeline encodes its conditioning video, traced on fake tensors (``fake=False``: run for
    real, the check at a tiny size); activations count the video and what the encode creates (its latent
    distribution's parameters included). ``tiling``: see :func:`trace_vae_decode`; ``repeated``: submodules traced
    once per input layout (:mod:`accelpatch.memory.repeats`; a fake trace only)."""
    import torch

    from accelpatch.memory.components import torch_dtype, trace_mode
    from accelpatch.memory.live_bytes import LiveBytes, module_bytes
    from accelpatch.memory.repeats import RepeatedCalls, submodules

    with trace_mode(fake):
        vae = _vae(class_name, config, dtype, tiling)
        video = torch.zeros(batch, 3, *size, dtype=torch_dtype(dtype))
        with torch.no_grad(), LiveBytes() as live, RepeatedCalls(live, submodules(vae, repeated)):
            vae.encode(video)
        return module_bytes(vae), live.peak + video.untyped_storage().nbytes()


def trace_audio_decode(case, *, batch: int, dtype: str, fake: bool = True) -> tuple[int, int]:
    """(weights, activations) of an :class:`~accelpatch.models.families.AudioDecodeCase`'s decode as its pipeline
    runs it: the audio VAE's ``decode`` of ``batch`` latents, then the vocoder on what it made (held meanwhile), on
    fake tensors (``fake=False``: run for real, the check at a tiny size); activations count the latents."""
    import torch

    from accelpatch.memory.components import build_component, torch_dtype, trace_mode
    from accelpatch.memory.live_bytes import LiveBytes, module_bytes

    with trace_mode(fake):
        modules = [build_component(resolve(name), config, dtype) for name, config in
                   ((case.vae, case.vae_config), (case.vocoder, case.vocoder_config)) if name is not None]
        latents = torch.zeros(batch * case.batch_rows, *case.latent_shape, dtype=torch_dtype(dtype))
        with torch.no_grad(), LiveBytes() as live:
            made = modules[0].decode(latents, return_dict=False)[0]
            if len(modules) > 1:
                modules[1](made)
        return sum(map(module_bytes, modules)), live.peak + latents.untyped_storage().nbytes()


@dataclass(frozen=True)
class Stage:
    """One stage of a call: its weights and the peak of its activations, in bytes, or why it is not planned
    (``weights``/``activations`` None and ``note`` the reason)."""

    name: str
    weights: Optional[int] = None
    activations: Optional[int] = None
    note: str = ""
    #: the stage whose weights these are (the VAE's encode: the decode's), counted once with every component on
    #: the device; "": its own
    shares: str = ""

    @property
    def planned(self) -> bool:
        return self.weights is not None and self.activations is not None

    @property
    def total(self) -> Optional[int]:
        return self.weights + self.activations if self.planned else None


#: moves not planned together: group offloading hooks the transformer's blocks, where model offloading moves it
#: whole; the resident blocks are weighed in the compute dtype; the weight formats are one at a time; an encoder
#: on the CPU needs no int8
APART = ({"group_offload", "offload"}, {"group_offload", "fp8"}, {"group_offload", "quantised"},
         {"fp8", "quantised"}, {"text_on_cpu", "text_int8"}, {"vae_sliced", "vae_tiled"})


class Move(NamedTuple):
    """One way a plan can go down (see :meth:`MemoryPlan.moves`): its rank (its place in that list, lowest first),
    a short name, how to do it, and the :meth:`MemoryPlan.peak` options that plan it."""

    rank: int
    short: str
    text: str
    options: dict


@dataclass(frozen=True)
class MemoryPlan:
    """A call's planned memory by stage (see :func:`memory_plan`). ``stages``: text encoder, transformer step
    (unpatched), VAE decode, then the audio decode where the family makes sound; ``patched``: the transformer step
    patched with the recipe's setting. :meth:`peak` and :meth:`fits` combine them for a pipeline whose components all
    stay on the device, or one at a time
    (``offload=True``: ``enable_model_cpu_offload``)."""

    recipe: str
    model: str
    family: str
    size: tuple[int, int, int]
    batch: int
    dtype: str
    cfg: str
    call: str
    stages: tuple[Stage, ...]
    patched: Optional[Stage]
    patch: str
    assumptions: tuple[str, ...]
    seconds: float
    budget: Optional[int] = None
    details: dict = field(default_factory=dict)

    def stage_list(self, patched: bool = True, fp8: bool = False, low: Optional[str] = None,
                   text_on_cpu: bool = False, vae_tiled: bool = False, group_offload: bool = False,
                   quantised: Optional[str] = None, text_int8: bool = False, vae_sliced: bool = False) -> list[Stage]:
        """The stages of the call, the transformer step patched or not; ``fp8``: its weights stored in fp8
        (``enable_layerwise_casting``; the plan's ``details["fp8_weights"]``, planned with a budget); ``low``: the
        step patched with ``memory="low"`` instead, "checked" (the default tier: a process's first call checks
        each chunked computation against the whole one) or "unchecked" (at tier high: the steady steps' figure
        from the first step on), planned with a budget where the patched call does not fit; ``text_on_cpu``: the
        text encoder never on the device (the prompt encoded on the CPU and passed as ``prompt_embeds``);
        ``vae_tiled``: the VAE decoded with ``vae.enable_tiling()`` (planned with a budget the call misses);
        ``group_offload``: the transformer's weights under block-level group offloading with streams (its resident
        blocks, :func:`group_offload_resident`; planned with a budget; not with ``fp8``); ``quantised``: the
        transformer's linear layers quantised by torchao, "int8" or "fp8" weight-only (:func:`torchao_weights`; its
        activations hold one dequantised weight more; planned with a budget where torchao imports), or loaded from
        GGUF: "gguf:Q8_0", "gguf:Q4_K" (every linear weight in that type, planned with a budget the call misses)
        or "gguf:<file name>" (the file ``memory_plan(gguf=...)`` read; :mod:`~accelpatch.memory.gguf_weights`: its
        activations hold what the layers' dequantisation adds, traced); ``text_int8``: the text encoders quantised
        the same way, int8 weight-only; ``vae_sliced``: the VAE decoded with ``vae.enable_slicing()``, one video of
        the batch at a time (planned with a budget the call misses, for more than one video per prompt)."""
        stages = [s for s in self.stages if not (text_on_cpu and s.name == "text encoder")]
        if text_int8:
            weighed = self.details.get("text_int8")
            if not isinstance(weighed, tuple):
                raise ValueError("this plan has no int8 text encoders: " + (weighed or "plan it with a budget"))
            stages = [dataclasses.replace(s, weights=weighed[0], activations=s.activations + weighed[1])
                      if s.name == "text encoder" else s for s in stages]
        if vae_sliced:
            if "vae_sliced" not in self.details:
                raise ValueError("this plan has no sliced VAE decode: it is planned with a budget the patched call "
                                 "does not fit, for more than one video per prompt")
            if vae_tiled:
                raise ValueError("vae_sliced and vae_tiled are planned one at a time")
            stages = [self.details["vae_sliced"] if s.name == "VAE decode" else s for s in stages]
        if vae_tiled:
            if "vae_tiled" not in self.details:
                raise ValueError("this plan has no tiled VAE decode: it is planned with a budget the patched call "
                                 "does not fit (or with vae_tiling=True)")
            tiled = {"VAE decode": self.details["vae_tiled"], "VAE encode": self.details.get("vae_encode_tiled")}
            stages = [tiled.get(s.name) or s for s in stages]
        step = self._unpatched_step()
        if patched and self.patched is not None:
            step = self.patched
        if low is not None:
            if low not in self.details.get("low_memory", {}):
                raise ValueError(f"this plan has no memory='low' step {low!r}: it is planned with a budget the "
                                 "patched call does not fit")
            step = self.details["low_memory"][low]
        if sum(map(bool, (fp8, group_offload, quantised))) > 1:
            raise ValueError("fp8 storage, group offloading and quantised weights are planned one at a time")
        if quantised is not None:
            weighed = self._quantised(quantised)
            if step.planned:
                step = dataclasses.replace(step, weights=weighed[0], activations=step.activations + weighed[1])
        for asked, key, what in ((fp8, "fp8_weights", "fp8 weights"), (group_offload, "group_offload",
                                                                        "group offloading")):
            if not asked:
                continue
            if key not in self.details:
                raise ValueError(f"this plan has no {what}: plan it with a budget (memory_plan(..., budget=...))")
            if step.planned:
                step = dataclasses.replace(step, weights=self.details[key])
        stages = [step if s.name.startswith("transformer step") else s for s in stages]
        return stages + self._other_experts(step)

    def _unpatched_step(self) -> Stage:
        return next(s for s in self.stages if s.name.startswith("transformer step"))

    def _other_experts(self, step: Stage) -> list[Stage]:
        """The transformers beside the one that runs a step (Wan 2.2 A14B's second expert: the same shape, so the
        step's weights, as stored in whatever form the step is planned in); resident with every component on the
        device, each alone under offload; empty for one transformer."""
        others = int(self.details.get("experts", 1)) - 1
        if others < 1 or not step.planned:
            return []
        return [Stage("other experts" if others > 1 else "the other expert", others * step.weights, 0,
                      "transformer_2: resident, not running" if others == 1 else "resident, not running")]

    def _quantised(self, quantised: str) -> tuple[int, int]:
        """The weighed (bytes, temporary) of a ``quantised`` option of :meth:`stage_list`, or a ValueError naming the
        ones this plan has."""
        source, name = ("gguf", quantised[len("gguf:"):]) if quantised.startswith("gguf:") else ("torchao", quantised)
        found = self.details.get(source, {}).get(name)
        if not isinstance(found, tuple):
            have = [k for k, v in self.details.get("torchao", {}).items() if isinstance(v, tuple)] + [
                f"gguf:{k}" for k, v in self.details.get("gguf", {}).items() if isinstance(v, tuple)]
            raise ValueError(f"this plan has no {quantised!r} weights"
                             + (f" ({found})" if isinstance(found, str) else "")
                             + (f"; it has {', '.join(have)}" if have else "; plan it with a budget (torchao "
                                f"{', '.join(TORCHAO_CONFIGS)}; GGUF {', '.join(GGUF_TYPES)}) or a GGUF file"))
        return found

    def peak(self, *, patched: bool = True, offload: bool = False, fp8: bool = False, low: Optional[str] = None,
             text_on_cpu: bool = False, vae_tiled: bool = False, group_offload: bool = False,
             quantised: Optional[str] = None, text_int8: bool = False, vae_sliced: bool = False) -> tuple[int, bool]:
        """(the call's peak bytes, whether every stage was planned): every weight resident plus the largest
        activations, or with ``offload`` the largest stage alone; ``fp8``, ``low``, ``text_on_cpu``, ``vae_tiled``,
        ``group_offload``, ``quantised``, ``text_int8``, ``vae_sliced``: see :meth:`stage_list`. When a stage is not
        planned, the bytes are a lower bound."""
        stages = self.stage_list(patched, fp8, low, text_on_cpu, vae_tiled, group_offload, quantised, text_int8,
                                 vae_sliced)
        known = [s for s in stages if s.planned]
        if offload:
            value = max((s.total for s in known), default=0)
        else:
            value = sum(s.weights for s in known if not s.shares) + max((s.activations for s in known), default=0)
        return value, len(known) == len(stages)

    def fits(self, budget: Union[int, str, None] = None, *, patched: bool = True, offload: bool = False,
             fp8: bool = False, low: Optional[str] = None, text_on_cpu: bool = False,
             vae_tiled: bool = False, group_offload: bool = False, quantised: Optional[str] = None,
             text_int8: bool = False, vae_sliced: bool = False) -> Optional[bool]:
        """Whether the call fits ``budget`` (bytes or "24GiB"; default the plan's): True or False, or None when a
        stage that is not planned could decide it (the planned ones fit)."""
        budget = self.budget if budget is None else budget
        if budget is None:
            raise ValueError("fits() needs a budget (bytes or a size such as '24GiB')")
        budget = parse_size(budget) if isinstance(budget, str) else int(budget)
        value, complete = self.peak(patched=patched, offload=offload, fp8=fp8, low=low, text_on_cpu=text_on_cpu,
                                    vae_tiled=vae_tiled, group_offload=group_offload, quantised=quantised,
                                    text_int8=text_int8, vae_sliced=vae_sliced)
        if value > budget:
            return False
        return True if complete else None

    def table(self) -> str:
        """The plan as text: the call, one row per stage (GiB), the peaks and, with a budget, the verdict."""
        lines = [f"memory plan: {self.recipe} ({self.model}, {self.family})", f"call: {self.call}",
                 f"transformer: {self.details.get('config', '')}", "",
                 f"{'stage':<34}{'weights':>11}{'activations':>13}{'total':>11}"]
        unpatched = self._unpatched_step()
        at = self.stages.index(unpatched) + 1
        rows = [*self.stages[:at], *([self.patched] if self.patched else []), *self.stages[at:],
                *self._other_experts(unpatched)]
        for stage in rows:
            if stage.planned:
                lines.append(f"{stage.name:<34}{gib(stage.weights):>11}{gib(stage.activations):>13}"
                             f"{gib(stage.total):>11}" + (f"  {stage.note}" if stage.note else ""))
            else:
                lines.append(f"{stage.name:<34}not planned yet: {stage.note}")
        verdicts = {True: "fits", False: "does NOT fit", None: "fits so far"}
        lines += ["", f"{'peak of the call':<34}{'all components on the device':>30}{'one at a time (offload)':>30}"]
        for patched in ([False, True] if self.patched else [False]):
            cells = []
            for offload in (False, True):
                value, complete = self.peak(patched=patched, offload=offload)
                verdict = f" {verdicts[self.fits(patched=patched, offload=offload)]}" if self.budget else ""
                cells.append(f"{'' if complete else '>= '}{gib(value)}{verdict}")
            lines.append(f"{'patched' if patched else 'unpatched':<34}{cells[0]:>30}{cells[1]:>30}")
        if "gguf_file" in self.details:
            lines += self._gguf_file_rows(verdicts)
        unplanned = [s.name for s in self.stages if not s.planned]
        if unplanned:
            lines.append(f">= : a lower bound, the {' and the '.join(unplanned)} not planned yet"
                         + ("; 'fits so far': the planned stages fit, the unplanned decide" if self.budget else ""))
        if self.budget:
            lines += self.options_to_fit()
            lines.append(f"budget: {gib(self.budget)} (live tensors only: leave headroom for the allocator and "
                         "kernel workspaces)")
        lines += ["", "assumptions:", *(f"  - {a}" for a in self.assumptions),
                  f"planned in {self.seconds:.1f} s on fake tensors (no weights downloaded, no math run)"]
        return "\n".join(lines)

    def _gguf_file_rows(self, verdicts: Mapping[Optional[bool], str]) -> list[str]:
        """The peak rows of the call (patched where the plan has the patched step) with the transformer loaded from
        the plan's GGUF file, or why not."""
        name = self.details["gguf_file"]
        weighed = self.details["gguf"][name]
        if not isinstance(weighed, tuple):
            return [f"{name}: not weighed: {weighed}"]
        cells = []
        for offload in (False, True):
            value, complete = self.peak(offload=offload, quantised=f"gguf:{name}")
            verdict = f" {verdicts[self.fits(offload=offload, quantised=f'gguf:{name}')]}" if self.budget else ""
            cells.append(f"{'' if complete else '>= '}{gib(value)}{verdict}")
        label = f"{'patched' if self.patched else 'unpatched'}, from {name}"
        return [f"{label:<34}{cells[0]:>30}{cells[1]:>30}",
                f"  ({name}: transformer weights {gib(weighed[0])}; its layers' dequantisation adds "
                f"{gib(weighed[1])} to the step's peak)"]

    def moves(self) -> list[Move]:
        """The ways down this plan has figures for, the least costly in speed first: ``memory="low"`` (the same
        output at about the same speed; checked, or at tier high unchecked), model offload (each component moved
        once per call), the prompt encoded on the CPU (that encoding's time, once per prompt), the transformer's
        blocks group-offloaded (every block moved at every step, overlapped), the VAE decoded in tiles (lossy: blended
        tiles, once per call), the text encoder in int8 (lossy, once per prompt), fp8 weight storage (every layer
        cast at every step, lossy), torchao's int8 and fp8 weight-only transformer (lossy; where torchao imports), a GGUF
        Q8_0 and Q4_K transformer (lossy, every layer dequantised at every call; where gguf imports)."""
        details = self.details
        text = next((s for s in self.stages if s.name == "text encoder"), None)
        lossy = "(lossy: measure it with accelpatch validate)"
        offered = [  # (whether this plan has its figures, short name, how to do it, the peak() options), in rank order
            (bool(details.get("low_memory")), "memory='low'",
             "accelpatch.apply(pipe, memory='low') (the same output bit for bit)", dict(low="checked")),
            (bool(details.get("low_memory")), "memory='low' at tier high (unchecked chunks)",
             "accelpatch.apply(pipe, memory='low', tier='high') (its chunks unchecked, so the first step holds no more "
             "than the others; tier high also admits the recipe's approximate paths)", dict(low="unchecked")),
            ("vae_sliced" in details, "vae.enable_slicing()", "vae.enable_slicing() (the batch's videos decoded one at "
             "a time: each video's math, though a GPU may pick other kernels for one video than for the batch)",
             dict(vae_sliced=True)),
            (True, "enable_model_cpu_offload()", "enable_model_cpu_offload() (one component on the device at a time)",
             dict(offload=True)),
            (text is not None and text.planned, "the prompt encoded on the CPU",
             "the prompt encoded on the CPU (load the pipeline with text_encoder=None and pass prompt_embeds from the "
             "text encoder run on the CPU)", dict(text_on_cpu=True)),
            ("group_offload" in details, "group offloading of the transformer",
             "group offloading of the transformer: transformer.enable_group_offload(onload_device='cuda', "
             "offload_type='block_level', num_blocks_per_group=1, use_stream=True) (the same output; every block's "
             "weights move to the device at every step, overlapped with compute)", dict(group_offload=True)),
            ("vae_tiled" in details, "vae.enable_tiling()", "vae.enable_tiling() (lossy: tiles decoded apart and "
             "blended; measure it with accelpatch validate, a candidate with vae_tiling)", dict(vae_tiled=True)),
            (isinstance(details.get("text_int8"), tuple), "the text encoder in int8",
             "the text encoder quantised by torchao: torchao.quantization.quantize_(pipe.text_encoder, "
             f"Int8WeightOnlyConfig()) {lossy}", dict(text_int8=True)),
            ("fp8_weights" in details, "fp8 weight storage", "the transformer's weights stored in fp8: "
             "transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16) "
             + lossy, dict(fp8=True)),
            *((isinstance(weighed, tuple), f"torchao {kind} weight-only", "the transformer quantised by torchao: "
               f"torchao.quantization.quantize_(transformer, {TORCHAO_CONFIGS[kind]}()) {lossy}", dict(quantised=kind))
              for kind, weighed in details.get("torchao", {}).items()),
            *((isinstance(weighed, tuple), f"GGUF {kind} weights", f"the transformer from a GGUF {kind} file: "
               f"{self.details.get('transformer_class', 'the transformer class')}.from_single_file('<{kind} file>.gguf', "
               "quantization_config=GGUFQuantizationConfig(compute_dtype=...)) (each layer dequantised at every call; "
               f"lossy: measure it with accelpatch validate)", dict(quantised=f"gguf:{kind}"))
              for kind, weighed in details.get("gguf", {}).items() if kind in GGUF_TYPES),
        ]
        if int(details.get("experts", 1)) > 1:  # a transformer's move is every expert's (they are all loaded)
            offered = [(has, short, how + (" on every expert: transformer and transformer_2" if {
                "group_offload", "fp8", "quantised"} & set(options) else ""), options)
                for has, short, how, options in offered]
        return [Move(rank, short, how, options)
                for rank, (_, short, how, options) in enumerate(o for o in offered if o[0])]

    def options_to_fit(self) -> list[str]:
        """Where the patched call does not fit the plan's budget with every component on the device: the first
        combination of :meth:`moves` that would make it fit, those whose costliest move ranks lowest first (fewer
        moves first among them: the output-keeping moves rank before the lossy ones, each cheapest in speed first),
        or why none."""
        if not self.budget or self.fits() is not False:
            return []
        moves = self.moves()
        combos = [c for n in range(1, len(moves) + 1) for c in itertools.combinations(moves, n)
                  if sum("low" in m.options for m in c) <= 1  # memory='low' checked or unchecked, not both
                  and not any(pair <= {k for m in c for k in m.options} for pair in APART)]
        combos.sort(key=lambda c: (max(m.rank for m in c), len(c), [m.rank for m in c]))
        for combo in combos:
            option = {k: v for m in combo for k, v in m.options.items()}
            verdict = self.fits(**option)
            if verdict is not False:
                value, _ = self.peak(**option)
                said = combo[0].text if len(combo) == 1 else " and ".join(m.short for m in combo)
                return [f"to fit {gib(self.budget)}: {said}: {gib(value)}"
                        + ("" if verdict else " (fits so far: a stage is not planned)")]
        return [f"to fit {gib(self.budget)}: none of {', '.join(m.short for m in moves)} is enough, nor any "
                "combination"]

    def __str__(self) -> str:
        return self.table()


def _call_value(call: Mapping[str, Any], *names: str) -> Any:
    return next((call[n] for n in names if call.get(n) is not None), None)


def _latent_grid(memory: MemorySettings, height: int, width: int, frames: int,
                 call: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """(pixel frames as the pipeline rounds them, latent frames, latent height, latent width, audio) of a call."""
    if memory.frames is not None:
        frames = resolve(memory.frames)(frames)
    latent_frames = (resolve(memory.latent_frames)(frames) if memory.latent_frames is not None
                     else (frames - 1) // memory.temporal + 1)
    audio = resolve(memory.audio)(frames, call) if memory.audio is not None else 0
    return frames, latent_frames, height // memory.spatial, width // memory.spatial, audio


def _pixels(family: str, memory: MemorySettings, call: Mapping[str, Any], height, width,
            frames) -> tuple[int, int, int]:
    height = height if height is not None else call.get("height")
    width = width if width is not None else call.get("width")
    frames = frames if frames is not None else _call_value(call, "num_frames", "frames")
    if (height is None) != (width is None):
        raise ValueError("give height and width together, or neither")
    size = memory.size
    if memory.canvas is not None and (height is None or frames is None):
        size = resolve(memory.canvas)()
    if height is None:
        if size is None:
            raise ValueError(f"the recipe's call gives no height and width and the {family} pipeline takes them "
                             "from its input image: pass height= and width= (--height/--width)")
        height, width = size[:2]
    if frames is None:
        frames = (size or (0, 0, 121))[2]
    for name, value in (("height", height), ("width", width), ("frames", frames)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if height % memory.multiple or width % memory.multiple:
        raise ValueError(f"height and width must be multiples of {memory.multiple} for this family (its VAE's "
                         f"spatial compression x the patch), got {height}x{width}")
    return height, width, frames


def _cfg(memory: MemorySettings, call: Mapping[str, Any]) -> tuple[int, str]:
    """(the factor CFG multiplies the transformer's batch by, what the pipeline does)."""
    guidance = call.get("guidance_scale", memory.guidance)
    if memory.guidance_rule is not None:
        on, what = resolve(memory.guidance_rule)(call, guidance)
    else:
        on, what = (guidance or 0) > 1, f"guidance_scale {guidance}"
    if memory.cfg == "distilled":
        return 1, "guidance-distilled: one forward per step, no CFG batch"
    if not on:
        return 1, f"no CFG ({what}): one forward per step"
    if memory.cfg == "batch":
        return 2, f"CFG ({what}) runs as one batch of 2 per video (unconditional and conditional together)"
    return 1, f"CFG ({what}) runs two forwards of the videos' batch, one after the other"


def _text_encoder_stage(memory: MemorySettings, call: Mapping[str, Any], model: str, dtype: str, tokens: int,
                        details: dict, say: Callable[[str], None]) -> tuple[Stage, tuple]:
    """(the text-encoder stage: every encoder the family's pipeline loads (their weights together) and the largest
    of their calls' activations, or, where the family names none, not planned and why; the encoders' cases).
    ``tokens``: the plan's text tokens, which an encoder of the prompt's own tokens (``unpadded``) sees."""
    from accelpatch.memory.text_encoder import text_encoder_summary, trace_text_encoder

    if memory.text_encoders is None:
        return Stage("text encoder", note=memory.text_encoder), ()
    cases = tuple(dataclasses.replace(case, tokens=tokens) if case.unpadded else case
                  for case in resolve(memory.text_encoders)(call, model))
    say(f"tracing the text encoder ({', '.join(c.name for c in cases)}) ...")
    traces = [trace_text_encoder(case, dtype) for case in cases]
    details["text_encoders"] = "; ".join(
        f"{case.name} from {case.source}" + "".join(f" ({n})" for n in trace.notes)
        for case, trace in zip(cases, traces))
    return Stage("text encoder", sum(t.weights for t in traces), max(t.activations for t in traces),
                 text_encoder_summary(traces)), tuple(cases)


def _text_stage(memory: MemorySettings, call: Mapping[str, Any], model: str, dtype, videos: int, cfg: int,
                tokens: int, say) -> Stage:
    """The stage of what the pipeline runs on the text encoder's output (LTX-2's connectors), or why not planned."""
    from accelpatch.memory.text_encoder import trace_text_stage

    case = resolve(memory.text_stage)(call, model)
    if isinstance(case, str):
        return Stage("after the text encoder", note=case)
    say(f"tracing the {case.name} ...")
    weights, activations, parameters = trace_text_stage(case, dtype, videos, cfg, tokens)
    return Stage(case.name, weights, activations, f"{parameters / 1e9:.2f}B from {case.source}, {videos * cfg} x "
                                                  f"{tokens} tokens")


def _audio_stage(memory: MemorySettings, call: Mapping[str, Any], model: str, audio: int, videos: int, dtype,
                 details: dict, say) -> Stage:
    """The audio decode after the video's (the family's ``audio_decode``), or why it is not planned."""
    case = resolve(memory.audio_decode)(call, model, audio)
    if isinstance(case, str):
        return Stage("audio decode", note=case)
    say("tracing the audio decode ...")
    weights, activations = trace_audio_decode(case, batch=videos, dtype=dtype)
    details["audio_decode"] = (f"{case.source}; latents {videos * case.batch_rows} x "
                               f"{' x '.join(map(str, case.latent_shape))}")
    return Stage("audio decode", weights, activations)


#: what a plan's GGUF figures assume (:mod:`~accelpatch.memory.gguf_weights`)
GGUF_ASSUMPTION = (
    "GGUF: as diffusers loads a file (from_single_file with GGUFQuantizationConfig): its quantised tensors kept as "
    "stored (those of the modules the model keeps in float32 dequantised to float32), its F32/F16 ones in the "
    "compute dtype; each GGUFLinear dequantises its whole weight at every call, traced where it runs (4-10 bytes a "
    "weight by type; on CUDA with the kernels package some types multiply without it, holding less); figured on "
    "the unpatched step and added to the row's; by type: every linear weight whose rows split into the type's blocks")


def _describe_patch(arguments: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in arguments.items() if v is not None) or "defaults"


def memory_plan(recipe_or_name: Any, *, height: Optional[int] = None, width: Optional[int] = None,
                frames: Optional[int] = None, batch: Optional[int] = None, dtype: Optional[str] = None,
                budget: Union[int, str, None] = None, patched: bool = True, text_tokens: Optional[int] = None,
                tier: Optional[str] = None, memory: Optional[str] = None, chunk_tokens: Optional[int] = None,
                vae_tiling: bool = False, gguf: Union[str, os.PathLike, None] = None,
                progress: Optional[Callable[[str], None]] = None) -> MemoryPlan:
    """Plan the peak memory of ``recipe_or_name``'s call by stage, at the size its call gives (or ``height``,
    ``width``, ``frames``: pixels), for ``batch`` videos per prompt (CFG's batch added where the pipeline batches
    it), in ``dtype`` ("bf16", "fp16", "fp32"; default the recipe's). ``patched``: also plan the transformer step
    patched with the recipe's tier, backend and options (``tier``: at this tier instead, "exact", "lossless" or
    "high"; "lossless" is apply()'s default, whatever backend the recipe names then only where lossless);
    ``memory="low"``: with apply()'s lower-memory mode (``chunk_tokens``: its ``memory_chunk_tokens``, also used
    where a budget the patched call misses plans that mode as an option to fit). ``budget``
    (bytes or "24GiB") is what :meth:`MemoryPlan.fits` and the table judge against; with it the transformer is also
    weighed with fp8 weight storage, torchao's int8 and fp8 weight-only quantisation and group offloading
    (:meth:`MemoryPlan.moves`, :meth:`MemoryPlan.options_to_fit`). ``progress`` gets one line before each slow
    stage. ``vae_tiling``: the VAE decode with ``vae.enable_tiling()`` (diffusers' default tiles; lossy), which a
    budget the patched call misses also plans as an option to fit, as it plans the transformer loaded from GGUF files
    of the common types (:data:`~accelpatch.memory.gguf_weights.GGUF_TYPES`, traced); ``gguf``: a GGUF
    file of the transformer to weigh as it is (its header read, no tensor data), a row of its own under the
    peaks (``peak(quantised="gguf:<file name>")``)."""
    from accelpatch.recipes import load_recipe

    start = time.perf_counter()
    mode = memory  # apply()'s memory=; ``memory`` names the family's settings below
    say = progress or (lambda line: None)
    recipe = load_recipe(recipe_or_name)
    if budget is not None and isinstance(budget, str):
        budget = parse_size(budget)
    if recipe.is_tiny:
        raise ValueError(f"{recipe.model} is a tiny test model: the planner plans released configurations "
                         "(measure a tiny one with accelpatch.memory.LiveBytes)")
    family = family_of(recipe.model)
    if family is None:
        raise ValueError(f"no model family recognised in {recipe.model!r}; families: "
                         f"{', '.join(f.key for f in _planned())}")
    memory = memory_settings(family)
    dtype = {v: k for k, v in DTYPES.items()}.get(str(dtype).removeprefix("torch."), dtype) or recipe.dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (or the torch dtype), got {dtype!r}")
    call = dict(recipe.call)
    height, width, frames = _pixels(family, memory, call, height, width, frames)
    frames, lat_f, lat_h, lat_w, audio = _latent_grid(memory, height, width, frames, call)
    videos = batch if batch is not None else int(call.get("num_videos_per_prompt") or 1)
    if videos < 1:
        raise ValueError(f"batch must be >= 1, got {videos}")
    cfg_factor, cfg_note = _cfg(memory, call)
    text = text_tokens if text_tokens is not None else memory.text_tokens
    torch_dtype = DTYPES[dtype]
    known = release_config(family, recipe.model)
    details: dict[str, Any] = {"latents": (lat_f, lat_h, lat_w), "audio": audio, "text_tokens": text,
                               "transformer_batch": videos * cfg_factor}
    text_stage, text_cases = _text_encoder_stage(memory, call, _normal(recipe.model), torch_dtype, text, details,
                                                 say)
    stages: list[Stage] = [text_stage]
    if memory.text_stage is not None:
        stages.append(_text_stage(memory, call, _normal(recipe.model), torch_dtype, videos, cfg_factor, text, say))
    vae_case = (resolve(memory.vae_for)(_normal(recipe.model)) if memory.vae_for else None) or memory.vae
    conditioning = int(resolve(memory.conditioning)(call, _normal(recipe.model), frames)) if memory.conditioning else 0
    trace_encode = None
    if conditioning:
        if isinstance(vae_case, str):
            stages.append(Stage("VAE encode", note=vae_case))
        else:
            say(f"tracing the VAE encode of the conditioning video ({conditioning} frames) ...")
            trace_encode = functools.partial(trace_vae_encode, vae_case.class_name, vae_case.config,
                                             (conditioning, height, width), batch=videos, dtype=torch_dtype,
                                             repeated=vae_case.encode_repeated)
            weights, activations = trace_encode(tiling=vae_tiling)
            what = "image" if conditioning == 1 else f"video: {conditioning} frames"
            stages.append(Stage("VAE encode", weights, activations, f"the conditioning {what} at the call's size"
                                + (", tiled" if vae_tiling else "") + " (the VAE's weights counted once)",
                                shares="VAE decode"))
    arguments = dict(recipe.apply_arguments())
    if tier is not None:
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        arguments["tier"] = tier
    if mode is not None:
        arguments["memory"] = mode
    if chunk_tokens is not None and mode is not None:
        arguments["memory_chunk_tokens"] = chunk_tokens
    patched_stage, patch = None, _describe_patch(arguments)
    if isinstance(known, str):
        details["config"] = "not planned"
        stages.append(Stage("transformer step", note=known))
        if gguf is not None:
            details["gguf"] = {Path(gguf).name: f"the transformer step is not planned: {known}"}
            details["gguf_file"] = Path(gguf).name
    else:
        config, source = known
        case = TransformerCase(family, config, lat_f, lat_h, lat_w, text, batch=videos * cfg_factor, audio=audio,
                               dtype=torch_dtype)
        say(f"tracing one transformer step (unpatched) at {height}x{width}x{frames} ...")
        plain = trace_step(case, linears=True)
        stages.append(Stage("transformer step, unpatched", plain.weights, plain.activations,
                            f"peak at {plain.peak_at}"))
        steps = int(call.get("num_inference_steps") or 50)
        if patched:
            say(f"tracing it patched ({patch}) ...")
            traced = trace_step(case, apply_arguments=arguments,
                                steps=tuple(sorted({0, steps // 2})), total_steps=steps)
            first = traced.first_activations or 0
            patched_stage = Stage("transformer step, patched", traced.weights, max(traced.activations, first),
                                  f"step {traced.step} of {steps}: {gib(traced.activations)}, peak at "
                                  f"{traced.peak_at}; a process's first call {gib(first)}, peak at "
                                  f"{traced.first_at} (its fused ops checked against their chains)")
        details["config"] = f"{source}; {plain.parameters / 1e9:.2f}B parameters"
        if memory.experts is not None:
            details["experts"] = int(resolve(memory.experts)(_normal(recipe.model)))
            if details["experts"] > 1:
                details["config"] += f" each, {details['experts']} experts (one runs a step, all are loaded)"
        if budget is not None:
            say("weighing the transformer with fp8 weight storage, torchao's int8/fp8 and group offloading ...")
            details["fp8_weights"] = layerwise_fp8_weights(case)
            details["group_offload"] = group_offload_weights(case)
            details["torchao"] = {kind: torchao_weights(case, kind) for kind in TORCHAO_CONFIGS}
        if gguf is not None:
            say(f"tracing it loaded from {os.fspath(gguf)} (its header read) ...")
            details.setdefault("gguf", {})[Path(gguf).name] = gguf_weights(case, Path(gguf), plain)
            details["gguf_file"] = Path(gguf).name
        details["transformer_class"] = resolve(memory.transformer).__name__
    if budget is not None and text_cases:
        from accelpatch.memory.text_encoder import quantised_text_encoders

        details["text_int8"] = quantised_text_encoders(text_cases, torch_dtype)
    tiles_by_default = getattr(vae_case, "tiles_by_default", False)  # a str: why the VAE is not planned
    if isinstance(vae_case, str):
        vae_stage = Stage("VAE decode", note=vae_case)
    else:
        say("tracing the VAE decode" + (" in tiles" if vae_tiling else "") + " ...")
        vae_notes: list[str] = []
        trace_vae = functools.partial(trace_vae_decode, vae_case.class_name, vae_case.config, (lat_f, lat_h, lat_w),
                                      batch=videos, dtype=torch_dtype, repeated=vae_case.repeated,
                                      stand_ins=vae_case.stand_ins, notes=vae_notes)
        weights, activations, channels = trace_vae(tiling=vae_tiling)
        tiled_note = "tiled (its default)" if tiles_by_default else "tiled (vae.enable_tiling())"
        vae_stage = Stage("VAE decode", weights, activations, tiled_note if vae_tiling or tiles_by_default else "")
        details["vae"] = "; ".join([f"{vae_case.source}, {channels} latent channels", *vae_notes])
    stages.append(vae_stage)
    if memory.audio_decode is not None:
        stages.append(_audio_stage(memory, call, _normal(recipe.model), audio, videos, torch_dtype, details, say))
    tokens = lat_f * lat_h * lat_w
    call_text = (f"{height}x{width}, {frames} frames -> latents {lat_f}x{lat_h}x{lat_w} ({tokens:,} latent pixels"
                 + (f", {audio} audio {memory.audio_unit}" if audio else "")
                 + f"), {text} text tokens; {videos} video(s) per prompt; {cfg_note}; {dtype}")
    assumptions = (
        f"every component in {dtype}, as from_pretrained(torch_dtype=...) loads it (modules diffusers keeps in "
        "float32 stay float32); no quantisation, offloading or VAE slicing; "
        + ("the VAE decoded in diffusers' default tiles (vae.enable_tiling(): lossy, the tiles are blended)"
           if vae_tiling else "the VAE decoded in the tiles it uses by default" if tiles_by_default
           else "no VAE tiling"),
        f"text: {memory.text_source}",
        *([f"text encoder: {details['text_encoders']}; each called on one prompt as its pipeline tokenises it "
           "(padded, or its own tokens; a negative prompt, where there is one, encoded after it), every token valid; "
           "all of them resident with every component on the device, and one stage under offload (their weights "
           "together)"] if "text_encoders" in details else []),
        "attention is flash-style: no tokens x tokens score matrix (CPU SDPA on fake tensors materialises none; a "
        "math backend would add batch x heads x tokens^2 elements per attention)",
        "live tensor bytes only: the allocator's caching and fragmentation, cuBLAS/flash-attention workspaces and "
        "kernels' internal temporaries are not counted (budget headroom for them)",
        "a stage's activations include its inputs (latents, text embeddings); the scheduler's and the pipeline's own "
        "tensors between stages are not counted",
        "patched: on fake tensors each lossless fused op the kernels would run allocates what its kernel "
        "allocates (its outputs; where the kernel would not run, its eager chain runs); the step planned is the "
        "larger of step 0 and the middle step, so step-dependent fast paths (Sol-Attn's dense steps) are seen both "
        "ways, and the row shows the larger of that and a process's first call, where each fused op is checked "
        "against its eager chain on first sight (an out-of-place op's results hashed one at a time and freed before "
        "its kernel runs, an in-place op's held beside the input it overwrites)",
        *([f"VAE: {details['vae']}"] if "vae" in details else []),
        *([GGUF_ASSUMPTION] if "gguf" in details else []),
        *([f"audio decode: {details['audio_decode']}"] if "audio_decode" in details else []),
        *([f"the recipe's {len(recipe.lora)} LoRA adapter(s) are not counted (their rank decides their size)"]
          if recipe.lora else []),
    )
    plan = MemoryPlan(recipe=recipe.name, model=recipe.model, family=family, size=(height, width, frames),
                      batch=videos, dtype=dtype, cfg=cfg_note, call=call_text, stages=tuple(stages),
                      patched=patched_stage, patch=patch, assumptions=assumptions,
                      seconds=time.perf_counter() - start, budget=budget, details=details)
    if budget is not None and plan.fits() is False:
        low = None
        if patched_stage is not None and mode is None:
            say("tracing it with memory='low' (the patched call does not fit) ...")
            chunking = {} if chunk_tokens is None else {"memory_chunk_tokens": chunk_tokens}
            low = trace_step(case, apply_arguments={**arguments, "memory": "low", **chunking},
                             steps=tuple(sorted({0, steps // 2})), total_steps=steps)
        if low is not None and low.activations < traced.activations:  # the family chunks something here
            note = (f"memory='low': steady steps {gib(low.activations)}, a process's first call "
                    f"{gib(low.first_activations or 0)}")
            details["low_memory"] = {
                "checked": Stage("transformer step, memory='low'", low.weights,
                                 max(low.activations, low.first_activations or 0), note),
                "unchecked": Stage("transformer step, memory='low' at tier high", low.weights, low.activations, note)}
        if not isinstance(known, str):
            say(f"tracing it loaded from GGUF {' and '.join(GGUF_TYPES)} files (the call does not fit) ...")
            details.setdefault("gguf", {}).update(
                {kind: gguf_weights(case, kind, plain) for kind in GGUF_TYPES})
            assumptions += () if GGUF_ASSUMPTION in assumptions else (GGUF_ASSUMPTION,)
        if videos > 1 and vae_stage.planned:
            say("tracing the VAE decode one video at a time (vae.enable_slicing(); the call does not fit) ...")
            weights, activations, _ = trace_vae(tiling=vae_tiling, slicing=True)
            details["vae_sliced"] = Stage("VAE decode", weights, activations,
                                          "one video at a time (vae.enable_slicing())"
                                          + (", tiled" if vae_tiling or tiles_by_default else ""))
        if not vae_tiling and not tiles_by_default and vae_stage.planned:
            say("tracing the VAE decode in tiles (the call does not fit) ...")
            weights, activations, _ = trace_vae(tiling=True)
            details["vae_tiled"] = Stage("VAE decode", weights, activations, "tiled (vae.enable_tiling())")
            if trace_encode is not None:  # enable_tiling() tiles the encode too
                weights, activations = trace_encode(tiling=True)
                details["vae_encode_tiled"] = Stage("VAE encode", weights, activations,
                                                    "the conditioning, tiled (vae.enable_tiling())",
                                                    shares="VAE decode")
        plan = dataclasses.replace(plan, details=details, assumptions=assumptions,
                                   seconds=time.perf_counter() - start)
    return plan

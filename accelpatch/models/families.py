"""The model families, each registered once by its own package (``accelpatch/models/<key>/__init__.py``), and read by
everything that names families: the adapter list (:mod:`.registry`), ``tiny:<name>`` recipes, the demo's
``--model``, diffusers' own model tests. Adding a family is its package (which registers it) plus its tests.

A family's tiny builders follow one convention in :mod:`accelpatch.testing`: the module ``accelpatch.testing.<key>``
with ``tiny_<key>_transformer``, ``<key>_transformer_inputs``, ``tiny_<key>_pipeline`` and
``<key>_pipeline_call_kwargs``. Importing this module imports neither torch nor diffusers.
"""
from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union


@dataclass(frozen=True)
class DemoSettings:
    """How ``python -m accelpatch demo --model <cli>`` runs the family's tiny pipeline."""

    #: which demo section: "sana" (the tiers), "sol" (backend sol_attn), "minimax-h3" (its packed sol_attn path)
    kind: str
    #: the transformer config of ``accelpatch.testing`` the demo builds (None: the builder's default)
    transformer_config: Optional[str]
    steps: int
    rounds: int
    outputs: tuple[str, ...] = ("frames",)
    #: the section's wall time as measured (one thread, an idle machine), and the CPU it was measured on: ``--help``
    #: states them (None: not measured yet)
    seconds: Optional[int] = None
    measured_on: str = "a 2-core AVX2 EPYC"


@dataclass(frozen=True)
class RecipeSettings:
    """How a recipe's ``model: tiny:<cli>`` builds the family's tiny pipeline and calls it."""

    #: the transformer config of ``accelpatch.testing`` the pipeline is built with (None: the builder's default)
    transformer_config: Optional[str] = None
    #: what the call adds so that frames come back as tensors
    output: tuple[tuple[str, str], ...] = (("output_type", "pt"),)
    #: the builder takes no dtype or device: the recipe must say fp32 on the CPU
    fp32_cpu_only: bool = False
    #: the least ``num_inference_steps`` a call may ask for, and why (None: 1)
    min_steps: Optional[tuple[int, str]] = None


@dataclass(frozen=True)
class TrainingSettings:
    """How ``python -m accelpatch train-tiny <cli>`` trains the family's tiny pipeline on procedural clips
    (:mod:`accelpatch.tiny_models`, issue #43), and how its trained weights are called. Functions are named
    "module:function", imported on first use."""

    #: builds the untrained pipeline a run starts from: ``build(seed, *, vae=None)``
    build: str
    #: the call kwargs at the training size: ``call_kwargs(prompt, **kwargs)``
    call_kwargs: str
    #: the pipeline class that loads a trained folder (the command's last line names it)
    pipeline: str
    #: the command-line name of the family whose shipped trained VAE the run reuses (None: it trains its own)
    vae_from: Optional[str] = None
    #: the pipeline's ``encode_prompt`` keywords that match how ``call_kwargs`` encodes prompts
    encode_kwargs: tuple[tuple[str, Any], ...] = ()
    #: imported before ``from_pretrained`` where diffusers does not define the pipeline class itself
    pipeline_module: Optional[str] = None
    #: what ``accelpatch.apply`` gets when ``make demo`` shows the shipped trained model under exact | lossless |
    #: high (:mod:`accelpatch.tools.demo_videos`), as (option, value) pairs: a setting whose high tier changes
    #: something on this toy and passes its gates
    demo_options: tuple[tuple[str, Any], ...] = ()
    #: the transformer's text inputs for a list of prompts, one row per prompt, exactly as the pipeline passes them:
    #: ``text_inputs(pipe, prompts, encode_kwargs) -> {keyword: tensor}`` (None: the pipeline's ``encode_prompt``
    #: embeddings, and its attention mask where it returns one)
    text_inputs: Optional[str] = None
    #: the transformer's latent inputs for noisy latents, as the pipeline builds them: ``model_inputs(latents) ->
    #: {keyword: tensor}`` (None: ``{"hidden_states": latents}``)
    model_inputs: Optional[str] = None
    #: the family's defaults for :class:`accelpatch.tiny_models.train.TrainingConfig` fields, as (field, value) pairs
    #: (a run's own arguments override them)
    config_defaults: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class VaeDecodeCase:
    """A family's VAE as the memory planner traces its decode: the diffusers class, its release configuration's
    fields and where they come from. ``repeated``: submodules called many times with one input layout (a decoder
    run per tile and chunk, or per frame with its feature cache in list arguments, Wan's), each traced once per
    layout (:mod:`accelpatch.memory.repeats`); ``stand_ins``: pairs
    (diffusers function, "module:function") the trace calls instead on fake tensors, where diffusers' own loops over
    values the trace does not have (checked by fingerprint: a changed function is traced as it is, slowly);
    ``tiles_by_default``: its decode already tiles (so ``vae.enable_tiling()`` is no move)."""

    class_name: str
    config: tuple[tuple[str, Any], ...] = ()
    source: str = ""
    repeated: tuple[str, ...] = ()
    stand_ins: tuple[tuple[str, str], ...] = ()
    tiles_by_default: bool = False
    #: ``repeated`` for an image-to-video pipeline's encode of its conditioning video (Wan's frame-chunked encoder)
    encode_repeated: tuple[str, ...] = ()


@dataclass(frozen=True)
class AudioDecodeCase:
    """A family's audio decode as the memory planner traces it, after the video's: the audio VAE (diffusers class,
    "module:Class", and its configuration's fields) decodes ``batch_rows`` latents of ``latent_shape`` per video (a
    mono VAE decodes the two stereo channels as two rows), then the vocoder, if any, turns what it made into a
    waveform; ``source``: where the configurations come from."""

    vae: str
    vae_config: tuple[tuple[str, Any], ...]
    latent_shape: tuple[int, ...]
    source: str
    vocoder: Optional[str] = None
    vocoder_config: tuple[tuple[str, Any], ...] = ()
    batch_rows: int = 1


@dataclass(frozen=True)
class MemorySettings:
    """What the memory planner (``python -m accelpatch memory``, :func:`accelpatch.memory.plan.memory_plan`, issue
    #44) needs to plan a call of the family's released models at full size on fake tensors: how its pipeline turns
    the call's pixels into latents, text tokens and a CFG batch, which transformer it builds at which release
    configuration and with which inputs, and what is known of its VAE and text encoder. It is kept with the family
    (its package registers it, its functions live in ``accelpatch.models.<key>.memory``) so that the planner names no
    family and a new family's plan is its package alone. Functions are named "module:function", imported on first
    use; the optional ones are set only where the family differs from the planner's generic rule."""

    #: words in a model's name (hub id or folder, lower case, "_" read as "-") that make it this family's
    names: tuple[str, ...]
    #: the order in which the families' names are tried, lowest first: a family whose words hold another's goes
    #: before it ("sana-video2" holds "sana-video")
    name_order: int
    #: the transformer class, "module:Class"
    transformer: str
    #: ``release_config(name) -> (config, source) | reason | None``: the transformer's release configuration for a
    #: model's name (as in ``names``), a dict or the name of a config in ``accelpatch.testing.<key>``, and where it
    #: comes from; or why none is known (None: none is known of that name)
    release_config: str
    #: ``transformer_inputs(case) -> {keyword: value}``: what the family's tiny builder
    #: ``accelpatch.testing.<key>.<key>_transformer_inputs(model, ...)`` is called with for one forward of an
    #: :class:`accelpatch.memory.plan.TransformerCase` (its shapes, batch and tokens)
    transformer_inputs: str
    #: the VAE's temporal and spatial compression, and what height and width must be multiples of (VAE x patch)
    temporal: int
    spatial: int
    multiple: int
    #: text tokens the transformer sees per prompt, and where that number comes from
    text_tokens: int
    text_source: str
    #: "batch": CFG doubles the transformer's batch; "sequential": the unconditional pass is a second forward;
    #: "distilled": the checkpoint has guidance baked in (one forward per step)
    cfg: str
    #: the pipeline's guidance_scale when the call gives none
    guidance: Optional[float]
    #: the pipeline's (height, width, frames) when the call gives none (None: the call must give them)
    size: Optional[tuple[int, int, int]]
    #: the text encoder(s), named in the table (and, where ``text_encoders`` is None, why they are not planned)
    text_encoder: str
    #: the VAE, or why it is not planned
    vae: Union[VaeDecodeCase, str]
    #: ``vae_for(model) -> VaeDecodeCase | str | None``: the VAE of a release whose VAE is not ``vae`` (None: ``vae``)
    vae_for: Optional[str] = None
    #: ``conditioning(call, model, frames) -> int``: the frames of the video the pipeline of ``model`` VAE-encodes
    #: before denoising, at the call's size (an image-to-video pipeline's conditioning video; 0: none). None: none
    conditioning: Optional[str] = None
    #: ``experts(model) -> int``: the transformers of that shape the pipeline loads, one running a step (Wan 2.2
    #: A14B's high- and low-noise experts: 2); None: one
    experts: Optional[str] = None
    #: ``frames(n) -> n``: the pixel frames the pipeline makes of the call's ``n`` (None: ``n``)
    frames: Optional[str] = None
    #: ``latent_frames(n) -> n``: the VAE's latent frames of ``n`` pixel frames (None: ``(n - 1) // temporal + 1``)
    latent_frames: Optional[str] = None
    #: ``audio(frames, call) -> int``: the audio the transformer sees beside the video, in ``audio_unit`` (None: none)
    audio: Optional[str] = None
    audio_unit: str = "latent frames"
    #: ``canvas() -> (height, width, frames)``: the pipeline's size when the call gives none, where the pipeline
    #: computes it (None: ``size``)
    canvas: Optional[str] = None
    #: ``guidance(call, guidance_scale) -> (CFG runs, what decides it, in words)``, where more than guidance_scale
    #: decides (None: guidance_scale > 1)
    guidance_rule: Optional[str] = None
    #: ``text_encoders(call, model) -> (TextEncoderCase, ...)``: the text (and image) encoders the pipeline of
    #: ``model`` (a name, as in ``names``) loads, at their release configurations, with the tokens it pads the prompt
    #: to (None: not planned, ``text_encoder`` says why)
    text_encoders: Optional[str] = None
    #: ``text_stage(call, model) -> TextStageCase | str``: a component the pipeline runs on the text encoder's output
    #: before denoising, once per call (LTX-2's text connectors), or why it cannot be planned (None: it has none)
    text_stage: Optional[str] = None
    #: ``audio_decode(call, model, audio) -> AudioDecodeCase | str``: what the pipeline decodes the ``audio`` (as
    #: ``audio`` counts it) with after the video, or why it cannot be planned (None: it makes no audio)
    audio_decode: Optional[str] = None


#: what a pipeline keeps of a text encoder's output while the call runs (see TextEncoderCase.output)
TEXT_ENCODER_OUTPUTS = ("last", "hidden_states", "stacked")


@dataclass(frozen=True)
class TextEncoderCase:
    """One text encoder of a pipeline: ``name`` (for the table), the ``transformers`` model and config classes
    ("module:Class"), the release configuration's fields, the tokens the pipeline pads the prompt to and where the
    configuration comes from (an image encoder beside them: ``image_size``). ``output``: "last" (the last hidden
    state), "hidden_states" (the pipeline asks for every layer's, ``output_hidden_states=True``, and keeps the tuple
    while it picks one) or "stacked" (it stacks them all into one tensor, LTX-2's ``torch.stack(hidden_states, -1)``).
    """

    name: str
    model: str
    config_class: str
    settings: Mapping[str, Any]
    tokens: int
    source: str
    output: str = "last"
    #: a note for the table (what the plan assumes about this encoder)
    note: str = ""
    #: an image encoder's square input size in pixels (called on ``pixel_values``; 0: a text encoder on tokens)
    image_size: int = 0
    #: the submodule the pipeline calls where it is not the loaded model ("model": MiniMax-H3 calls its Qwen3-VL's
    #: ``text_encoder.model``, so the language-model head is loaded but never run); "": the model itself
    calls: str = ""
    #: the pipeline encodes the prompt's own tokens, unpadded (MiniMax-H3): the plan's text tokens, which the
    #: transformer sees too, replace ``tokens``
    unpadded: bool = False

    def __post_init__(self) -> None:
        if self.output not in TEXT_ENCODER_OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(TEXT_ENCODER_OUTPUTS)}, got {self.output!r}")
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens!r}")


@dataclass(frozen=True)
class TextStageCase:
    """A component a pipeline runs once on its text encoder's output before denoising (LTX-2's text connectors):
    ``name`` (the stage's), the diffusers class ("module:Class") and its constructor arguments, the width of the
    hidden states it is called on (``(prompts x CFG, tokens, width)`` in the compute dtype, with a mask of ones),
    and where the configuration comes from. With CFG the pipeline concatenates [negative, positive] and still holds
    the negative half beside the concatenation."""

    name: str
    model: str
    settings: Mapping[str, Any]
    width: int
    source: str


def resolve(name: str) -> Any:
    """The object a "module:attribute" string names (imported on first use)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Family:
    """One model family: its package key, its name, its command-line name, its adapter class ("module:Class"), the
    order in which families are asked (a model goes to the first adapter that takes it; the demo runs them in this
    order) and its demo, recipe, training and memory-plan settings."""

    key: str
    name: str
    cli: str
    adapter: str
    order: int
    demo: DemoSettings
    recipe: RecipeSettings = RecipeSettings()
    #: diffusers' own test file of this family's model, relative to a diffusers checkout, which
    #: ``python -m accelpatch.testing.diffusers_tests`` runs unpatched and patched (None: none is run)
    diffusers_tests: Optional[str] = None
    #: how its tiny pipeline trains on procedural clips (None: no training recipe yet, random weights only)
    training: Optional[TrainingSettings] = None
    #: how the memory planner plans its released models' calls (None: not planned; the planner says so by name)
    memory: Optional[MemorySettings] = None

    def adapter_class(self) -> type:
        return resolve(self.adapter)


_FAMILIES: dict[str, Family] = {}
_LOCK = threading.Lock()
_DISCOVERED = False


def register(family: Family) -> Family:
    """Called by each family's package when it is imported. Registering one key twice with another record raises."""
    with _LOCK:
        known = _FAMILIES.get(family.key)
        if known is not None and known != family:
            raise ValueError(f"a different family is already registered as {family.key!r}")
        _FAMILIES[family.key] = family
    return family


def families() -> tuple[Family, ...]:
    """Every family, in their order; the first call imports every package under ``accelpatch.models`` (each
    registers its family: they import nothing heavy)."""
    global _DISCOVERED
    if not _DISCOVERED:
        import accelpatch.models as package

        for info in pkgutil.iter_modules(package.__path__):
            if info.ispkg:
                importlib.import_module(f"{package.__name__}.{info.name}")
        _DISCOVERED = True
    return tuple(sorted(_FAMILIES.values(), key=lambda f: (f.order, f.key)))


def by_cli(name: str) -> Family:
    """The family called ``name`` on the command line and in ``tiny:<name>`` (KeyError naming the valid ones)."""
    for family in families():
        if family.cli == name:
            return family
    raise KeyError(f"no model family is called {name!r}; families: {', '.join(f.cli for f in families())}")


def trainable_families() -> tuple[str, ...]:
    """Command-line names of the families with a tiny training recipe (:attr:`Family.training`), in their order."""
    return tuple(f.cli for f in families() if f.training is not None)

"""Train a family's tiny pipeline on procedural videos, on CPU, and save it as a diffusers folder.

Why: quality gates run on tiny models; random weights make noise, so a gate comparing two noise videos measures
nothing. A tiny model trained on clips with real structure (:mod:`accelpatch.tiny_models.procedural`) makes videos
that follow the prompt (the shipped ones: its colour and whether the shape grows or shrinks, not yet its direction
of motion), so temporal and per-frame gates have something to see.

What: two phases, both seeded. (1) Wan's tiny ``AutoencoderKLWan`` learns to reconstruct whole 13-frame clips
cropped to 64 x 64 (the VAE is convolutional, so crops train it for the full 128 x 256 frames at a fraction of the
cost), in passes checked by :func:`check_vae` (:attr:`TrainingConfig.vae_shape_weights`); its latents' per-channel
mean and std over the training clips go into its config (``latents_mean`` / ``latents_std``, as Wan's and
SANA-Video's pipelines un-normalise them). SANA-Video decodes with the same VAE class the same way, so it reuses the
shipped Wan's VAE instead of training one. SANA-Video 2.0 trains its own ``AutoencoderKLLTX2Video`` the same way
(its statistics are that class's ``latents_mean`` / ``latents_std`` buffers). (2) The family's tiny transformer
learns rectified flow on the normalised latents of a fixed set of encoded clips: x_t = (1 - sigma) x0 + sigma noise,
target noise - x0, sigma drawn uniformly then shifted by 3 (Wan's ``FlowMatchEulerDiscreteScheduler(shift=3)``,
SANA-Video's flow DPM-Solver++ at ``flow_shift=3``), timestep = 1000 sigma, conditioned on the fixed tiny text
encoder's embedding of the clip's prompt exactly as the pipeline encodes it (dropped to the empty prompt 10% of the
time, so classifier-free guidance works). A word-level tokenizer over the procedural vocabulary replaces the test
pipelines' 5-token one (which maps every prompt to one unknown token). A family whose transformer reads more than
latents and one text embedding (HunyuanVideo 1.5: two text streams, image embeddings, condition channels) says in its
:class:`~accelpatch.models.families.TrainingSettings` how its pipeline builds those inputs, and training feeds the same.

The result loads with the family's pipeline ``from_pretrained(folder)``; call it with
:func:`accelpatch.tiny_models.shipped.trained_call_kwargs`.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import time
import types
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from accelpatch.models.families import resolve
from accelpatch.tiny_models import TRAINABLE_FAMILIES, procedural
from accelpatch.tiny_models.detect import read_shape_video, shape_masks
from accelpatch.tiny_models.shipped import (MAX_SEQUENCE_LENGTH, shipped_families, shipped_folder,
                                            training_settings)

#: The trained tiny Wan transformer's shape: 2 heads x 128 (the Sol-Attn kernels' head dim), hidden 256, 4 layers,
#: ~3.3M parameters; :data:`accelpatch.testing.wan.WAN_SOL_CONFIG` with 4 layers instead of 2 (a test keeps them so),
#: written out here because accelpatch.testing loads the trained model (``trained=True``) and so stands above this
#: package. Four layers: with two it learned colours and growth, not the direction of a move (docs/tiny-models.md).
WAN_TRANSFORMER_CONFIG: dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=128,
                                              in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=256,
                                              num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                              rope_max_seq_len=32)
#: The trained tiny Wan VAE's shape: 8 channels wide at full resolution, 16 from half resolution down, 16 latent
#: channels, 4x temporal and 8x spatial compression (~220k parameters). The test pipelines' 3-channel VAE
#: (``base_dim=3``) washed the shapes' colours out however long it trained (docs/tiny-models.md, runs 1-3).
WAN_VAE_CONFIG: dict[str, Any] = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                      temperal_downsample=[False, True, True])
#: Scheduler shift (the tiny test pipeline's ``FlowMatchEulerDiscreteScheduler(shift=3.0)``).
FLOW_SHIFT = 3.0


@dataclass(frozen=True)
class TrainingConfig:
    """Sizes and rates of one training run. ``steps``: transformer steps; ``videos``: clips encoded once for the
    transformer phase; crops and the latent dataset are drawn from the seed."""

    steps: int = 5000
    vae_steps: int = 700  # per pass of vae_shape_weights
    videos: int = 512
    batch_size: int = 4
    vae_batch_size: int = 2
    #: clips per VAE call within a VAE step's batch (None: the whole batch in one call). A VAE that fails on a batch
    #: (HunyuanVideo 1.5's in diffusers 0.42) still learns from ``vae_batch_size`` clips a step, one call each.
    vae_clips_per_call: int | None = None
    lr: float = 5e-4
    vae_lr: float = 4e-3
    kl_weight: float = 1e-6
    #: the VAE trains in passes of ``vae_steps``, each on new clips, at half the previous pass's learning rate, the
    #: loss on the shapes' saturated pixels weighted this much over the background's: first plain reconstruction,
    #: then the shapes (a few per cent of the pixels) weighted 10x; then, while :func:`check_vae` still finds a
    #: problem, more weighted passes, up to ``vae_max_passes``. Measured: one 700-step pass kept 9 % of the clips'
    #: colour saturation, 10x from the start 12 %; two passes 104 % in one run and 14 % in another (the same
    #: settings on 1 and 2 threads): hence the check between passes (docs/tiny-models.md).
    vae_shape_weights: tuple[float, ...] = (1.0, 10.0)
    vae_max_passes: int = 5
    #: code the first latent frame apart (0: not): after the passes above, one more pass of ``vae_cue_steps`` steps
    #: at the last pass's rate and shape weight adds :func:`frame_cue_loss`, which pulls each clip's first latent
    #: frame, less its other frames, per channel and in channel stds, to this many times a fixed sign per channel;
    #: then the VAE is checked again. The LTX-2 VAE's causal encoder pads time with copies of the first frame, so its
    #: latents do not say where a clip starts (Wan's, padded with zeros, do), and a transformer whose only positions
    #: are RoPE's relative ones never learned which frame is which. Measured: the cue from the first step cost the VAE
    #: its colours (after three passes MSE 0.130, green and yellow as red); added to a trained VAE, it kept them
    #: (docs/tiny-models.md, SANA-Video 2.0's "Why it draws no direction")
    vae_frame_cue: float = 0.0
    vae_cue_steps: int = 2100
    prompt_dropout: float = 0.1
    #: then the transformer trains in motion phases, one per entry of ``motion_words`` in order, each ``motion_steps``
    #: more steps on the clips whose prompt holds one of that entry's words, at ``motion_lr`` (a fresh optimiser and
    #: schedule each): on the full clip mix a transformer learns colours and growth but draws "moves left" as a still
    #: shape; measured on the 4-layer Wan, 12 of 16 directions after a phase on "moves", 1 of 16 without it; on the
    #: 4-layer SANA-Video a "moves" phase cost growth and a second phase on "moves", "grows" and "shrinks" gave it back
    #: with the direction kept (docs/tiny-models.md)
    motion_steps: int = 0
    motion_lr: float = 5e-4
    motion_words: tuple[tuple[str, ...], ...] = (("moves",),)
    crop_frames: int = procedural.VIDEO_FRAMES  # whole clips in time: a VAE trained on 5 frames degrades after them
    crop_size: int = 64
    frames: int = procedural.VIDEO_FRAMES
    height: int = procedural.VIDEO_HEIGHT
    width: int = procedural.VIDEO_WIDTH


@dataclass
class TrainResult:
    """What a run did: where the folder is, the per-step losses of both phases and the time each phase took."""

    family: str
    out_dir: Path
    seed: int
    config: TrainingConfig
    vae_losses: list[float] = field(default_factory=list)
    transformer_losses: list[float] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    vae_check: dict[str, Any] = field(default_factory=dict)
    vae_from: str | None = None  # the shipped family whose trained VAE it reuses (None: trained its own)
    vae_pass_checks: list[dict[str, Any]] = field(default_factory=list)
    motion_losses: list[float] = field(default_factory=list)


def word_tokenizer(*, bos: bool = False):
    """A word-level tokenizer over :func:`procedural.vocabulary` (lower-cased, split on whitespace and punctuation;
    unknown words -> ``<unk>``), built offline; saves as ``tokenizer.json`` and loads with ``AutoTokenizer``.
    ``bos=True`` starts every text with ``<bos>``, as Gemma's tokenizer does (SANA-Video), so that even the empty
    prompt has one token its attention mask keeps."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **({"<bos>": 2} if bos else {})}
    for word in procedural.vocabulary():
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                       bos_token="<bos>")
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")


def _seeded_transformer_and_vae(seed: int, transformer_class, config: dict[str, Any], vae, *,
                                vae_class: str = "AutoencoderKLWan", vae_config: dict[str, Any] | None = None):
    """A family's transformer drawn after ``manual_seed(seed)``, and ``vae`` or a new diffusers ``vae_class`` of
    ``vae_config`` (default :data:`WAN_VAE_CONFIG`) drawn after ``seed + 1``; leaves the generator at ``seed + 2`` for
    the text encoder (the shipped runs' order)."""
    import diffusers

    torch.manual_seed(seed)
    transformer = transformer_class(**config)
    if vae is None:
        torch.manual_seed(seed + 1)
        vae = getattr(diffusers, vae_class)(**(WAN_VAE_CONFIG if vae_config is None else vae_config))
    torch.manual_seed(seed + 2)
    return transformer, vae


def _tiny_gemma(tokenizer, width: int):
    """The fixed one-layer Gemma-2 text encoder of the SANA families (``width`` channels, ``tokenizer``'s vocabulary
    and special tokens), drawn from the current generator."""
    from transformers import Gemma2Config, Gemma2Model

    return Gemma2Model(Gemma2Config(head_dim=16, hidden_size=width, intermediate_size=2 * width,
                                    num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2,
                                    vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                    bos_token_id=tokenizer.bos_token_id, attn_implementation="eager")).eval()


def build_wan_pipeline(seed: int = 0, *, vae=None):
    """An untrained tiny ``WanPipeline``: the transformer of :data:`WAN_TRANSFORMER_CONFIG` (2 heads x
    128, 4 layers, ~3.3M parameters), the VAE of :data:`WAN_VAE_CONFIG` (or ``vae``), a one-layer UMT5 text encoder
    (width 32) over :func:`word_tokenizer`'s vocabulary, all seeded; ``FlowMatchEulerDiscreteScheduler(shift=3)``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = word_tokenizer()
    transformer, vae = _seeded_transformer_and_vae(seed, WanTransformer3DModel, WAN_TRANSFORMER_CONFIG, vae)
    text_dim = int(WAN_TRANSFORMER_CONFIG["text_dim"])
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=text_dim,
                                               d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                               relative_attention_num_buckets=8))
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder.eval(), vae=vae.eval(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT), transformer=transformer.eval())


#: The trained tiny SANA-Video transformer's shape: the released head dim (2 heads x 112, as the SANA-Video tests'
#: ``SANA_VIDEO_RELEASE_LIKE_CONFIG``), 4 layers (2 learned colour but not direction, docs/tiny-models.md), Gemma
#: captions 32 wide; a test keeps it equal to that config with ``caption_channels=32`` and ``num_layers=4``.
SANA_VIDEO_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=112, num_layers=4,
    num_cross_attention_heads=2, cross_attention_head_dim=112, cross_attention_dim=224, caption_channels=32,
    mlp_ratio=2.5, dropout=0.0, attention_bias=False, sample_size=8, patch_size=(1, 2, 2),
    norm_elementwise_affine=False, norm_eps=1e-6, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def build_sana_video_pipeline(seed: int = 0, *, vae=None):
    """An untrained tiny ``SanaVideoPipeline``: the transformer of :data:`SANA_VIDEO_TRANSFORMER_CONFIG`, a
    one-layer Gemma-2 text encoder (width 32) over :func:`word_tokenizer` with ``<bos>``, the flow DPM-Solver++
    SANA-Video releases with (``DPMSolverMultistepScheduler``, flow prediction, shift 3, as it trains), and ``vae``
    (default: a random one of :data:`WAN_VAE_CONFIG`; training passes the shipped Wan's trained VAE)."""
    from diffusers import DPMSolverMultistepScheduler, SanaVideoPipeline, SanaVideoTransformer3DModel

    tokenizer = word_tokenizer(bos=True)
    transformer, vae = _seeded_transformer_and_vae(seed, SanaVideoTransformer3DModel, SANA_VIDEO_TRANSFORMER_CONFIG,
                                                   vae)
    text_encoder = _tiny_gemma(tokenizer, int(SANA_VIDEO_TRANSFORMER_CONFIG["caption_channels"]))
    scheduler = DPMSolverMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                            flow_shift=FLOW_SHIFT)
    return SanaVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(),
                             transformer=transformer.eval(), scheduler=scheduler)


#: The trained tiny SANA-Video 2.0 transformer's shape: the release's head dims (linear 128, softmax anchor 256, so
#: the anchors' Sol-Attn path runs), hidden 256, 2 layers (a linear one, then the anchor: the release rule at
#: ``softmax_ratio`` 0.25), each its own Attention Residual group, patch (1, 2, 2) over the LTX-2 VAE's 16 latent
#: channels (512 tokens per call at 13 x 128 x 256), captions 32 wide and 16 tokens long; ~2.6M parameters.
SANA_VIDEO2_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    in_channels=16, hidden_size=256, depth=2, num_heads=2, linear_head_dim=128, softmax_head_dim=256,
    softmax_ratio=0.25, mlp_ratio=2.0, caption_channels=32, model_max_length=MAX_SEQUENCE_LENGTH,
    attn_res_block_size=1, patch_size=(1, 2, 2), input_size=2, rope_max_seq_len=32)
#: The trained tiny SANA-Video 2.0 VAE: diffusers' ``AutoencoderKLLTX2Video`` (the release's VAE class) with the
#: release's patching (4 x 4 pixels into 48 channels at the input, back at the output) and one spatiotemporal and
#: one temporal stage after it: 4x temporal and 8x spatial compression, 16 latent channels, the encoder 32 wide, the
#: decoder 64 -> 32 -> 16 wide (the release's is 8 x 32 x 32 at 128 channels: at 13 x 128 x 256 that is 2 x 4 x 8
#: latents, too few tokens for attention to have structure), so it reads the same 13-frame clips as Wan's; ~0.74M
#: parameters. Measured (docs/tiny-models.md): without the patching (8x spatial in three stages at full resolution,
#: 0.96M parameters) it missed the round-trip limit after five passes (MSE 0.135) at a third of the speed; patched,
#: within every limit after the two planned passes. Its latents' statistics are the VAE's ``latents_mean`` /
#: ``latents_std`` buffers, which SanaVideo2Pipeline un-normalises with.
SANA_VIDEO2_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=16, patch_size=4, patch_size_t=1,
    block_out_channels=(32, 32), layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, True),
    downsample_type=("spatiotemporal", "temporal"),
    decoder_block_out_channels=(32, 64), decoder_layers_per_block=(1, 1, 1),
    decoder_spatio_temporal_scaling=(True, True), decoder_inject_noise=(False, False, False),
    upsample_type=("temporal", "spatiotemporal"), upsample_residual=(True, True), upsample_factor=(2, 2),
    spatial_compression_ratio=8, temporal_compression_ratio=4)


def build_sana_video2_pipeline(seed: int = 0, *, vae=None):
    """An untrained tiny :class:`~accelpatch.models.sana_video2.modeling.SanaVideo2Pipeline`: the transformer of
    :data:`SANA_VIDEO2_TRANSFORMER_CONFIG`, the ``AutoencoderKLLTX2Video`` of :data:`SANA_VIDEO2_VAE_CONFIG` (or
    ``vae``), a one-layer Gemma-2 text encoder (width 32) over :func:`word_tokenizer` with ``<bos>``, and the
    release's sampler (flow DPM-Solver++) at shift 3, as it trains."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2Pipeline, SanaVideo2Transformer3DModel

    tokenizer = word_tokenizer(bos=True)
    transformer, vae = _seeded_transformer_and_vae(seed, SanaVideo2Transformer3DModel,
                                                   SANA_VIDEO2_TRANSFORMER_CONFIG, vae,
                                                   vae_class="AutoencoderKLLTX2Video",
                                                   vae_config=SANA_VIDEO2_VAE_CONFIG)
    text_encoder = _tiny_gemma(tokenizer, int(SANA_VIDEO2_TRANSFORMER_CONFIG["caption_channels"]))
    return SanaVideo2Pipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(),
                              transformer=transformer.eval(),
                              scheduler=SanaVideo2Pipeline.release_scheduler(flow_shift=FLOW_SHIFT))


def untrained_pipeline(family: str, seed: int = 0, *, vae_from: str | None = None):
    """The pipeline a ``train_family(family, seed=seed, vae_from=vae_from)`` run starts from, progress bar off: every
    component random but a VAE reused from a shipped run (``vae_from``, default the family's own rule; SANA-Video:
    the trained Wan VAE). What trained weights are measured against."""
    vae_from = _vae_source(family, vae_from)
    vae = None if vae_from is None else _shipped_vae(vae_from, family)
    if vae is not None:
        training = training_settings(family)
        pipeline = getattr(importlib.import_module(training.pipeline_module or "diffusers"), training.pipeline)
        wanted = inspect.signature(pipeline.__init__).parameters["vae"].annotation
        if isinstance(wanted, (type, types.UnionType)) and not isinstance(vae, wanted):
            raise ValueError(f"train-tiny {family}: the shipped {vae_from} VAE is a {type(vae).__name__}, and "
                             f"{training.pipeline} decodes with {getattr(wanted, '__name__', wanted)}; reuse the VAE "
                             f"of a family whose pipeline takes that class")
    pipe = resolve(training_settings(family).build)(seed, vae=vae)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def train_family(family: str, out_dir: str | Path, *, steps: int | None = None, vae_steps: int | None = None,
                 videos: int | None = None, seed: int = 0, progress: bool = True, threads: int | None = None,
                 vae_from: str | None = None, **overrides: Any) -> TrainResult:
    """Train ``family``'s tiny pipeline from ``seed`` and save it to ``out_dir`` (a diffusers folder plus
    ``training.json``). ``steps`` / ``vae_steps`` / ``videos`` and any :class:`TrainingConfig` field override
    the defaults; ``threads`` sets torch's CPU threads for the run. Same seed, same threads, same machine: same
    weights. A family that reuses another's trained VAE (SANA-Video: Wan's) needs that family shipped first;
    ``vae_from`` names the shipped family whose VAE to reuse instead (a family's own: retrain the transformer alone on
    the VAE that ships, so that models built on that VAE keep it)."""
    if family not in TRAINABLE_FAMILIES:
        raise ValueError(f"train-tiny: no training for {family!r} yet (trainable: {', '.join(TRAINABLE_FAMILIES)})")
    given = dict(steps=steps, vae_steps=vae_steps, videos=videos, **overrides)
    config = TrainingConfig(**{**dict(training_settings(family).config_defaults),
                               **{k: v for k, v in given.items() if v is not None}})
    if config.motion_steps < 0:
        raise ValueError(f"train-tiny: motion_steps must be 0 (no motion phase) or more, got {config.motion_steps}")
    _check_motion_words(config.motion_words)
    if min(config.steps, config.vae_steps, config.videos, config.batch_size, config.vae_batch_size,
           1 if config.vae_clips_per_call is None else config.vae_clips_per_call) < 1:
        raise ValueError("train-tiny: steps, vae steps, videos, batch sizes and vae clips per call must be at least 1")
    if not config.vae_shape_weights or config.vae_max_passes < len(config.vae_shape_weights):
        raise ValueError(f"train-tiny: vae_max_passes ({config.vae_max_passes}) must be at least the number of "
                         f"planned VAE passes, vae_shape_weights {config.vae_shape_weights} (at least one)")
    if config.vae_frame_cue and config.vae_cue_steps < 1:
        raise ValueError(f"train-tiny: vae_cue_steps must be at least 1 when vae_frame_cue is set "
                         f"({config.vae_frame_cue}), got {config.vae_cue_steps}")
    vae_from = _vae_source(family, vae_from)
    if config.vae_frame_cue and vae_from is not None:
        raise ValueError(f"train-tiny: vae_frame_cue ({config.vae_frame_cue}) shapes a VAE the run trains, but this "
                         f"{family} run reuses the shipped {vae_from} VAE (vae_from): train its own VAE, or set "
                         "vae_frame_cue 0")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(family, Path(out_dir), config, seed, progress, vae_from)
    finally:
        torch.set_num_threads(previous_threads)


def _check_motion_words(phases) -> None:
    """ValueError unless ``phases`` is a non-empty tuple of phases, each a non-empty tuple of prompt words."""
    def words_of(phase) -> bool:
        return isinstance(phase, tuple) and bool(phase) and all(isinstance(word, str) for word in phase)

    if not isinstance(phases, tuple) or not phases or not all(map(words_of, phases)):
        raise ValueError(f"train-tiny: motion_words must be a non-empty tuple of phases, each a non-empty tuple of "
                         f"prompt words (e.g. (('moves',), ('moves', 'grows', 'shrinks'))), got {phases!r}")
    unknown = [word for phase in phases for word in phase if word not in procedural.vocabulary()]
    if unknown:
        raise ValueError(f"train-tiny: motion_words {phases!r}: not prompt words: {unknown}; choose from "
                         f"{', '.join(procedural.vocabulary())}")


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress, dynamic_ncols=True, leave=True)


def _vae_source(family: str, vae_from: str | None) -> str | None:
    """The shipped family whose VAE a run of ``family`` reuses: ``vae_from`` where given (a trainable family; that
    its VAE is of the class the pipeline takes is checked when the pipeline is built), else the family's rule (None:
    it trains its own)."""
    if vae_from is None:
        return training_settings(family).vae_from
    if vae_from not in TRAINABLE_FAMILIES:
        raise ValueError(f"train-tiny {family}: vae_from {vae_from!r} is not a trainable family (choose from "
                         f"{', '.join(TRAINABLE_FAMILIES)})")
    return vae_from


def _shipped_vae(family: str, wanted_by: str):
    """The trained VAE of the shipped ``family`` (the diffusers class its config names), in float32; ValueError
    saying to ship ``family`` first."""
    import diffusers

    if family not in shipped_families():
        raise ValueError(f"train-tiny {wanted_by}: reuses the trained {family} VAE, and no trained {family} ships; "
                         f"run `python -m accelpatch train-tiny {family} --ship` first")
    folder = shipped_folder(family) / "vae"
    vae_class = getattr(diffusers, json.loads((folder / "config.json").read_text())["_class_name"])
    return vae_class.from_pretrained(folder, torch_dtype=torch.float32).eval()


def _train(family: str, out_dir: Path, config: TrainingConfig, seed: int, progress: bool,
           vae_from: str | None) -> TrainResult:
    start = time.perf_counter()
    recipe = training_settings(family)
    result = TrainResult(family=family, out_dir=out_dir, seed=seed, config=config, vae_from=vae_from)
    pipe = untrained_pipeline(family, seed, vae_from=vae_from)
    if vae_from is None:
        t0 = time.perf_counter()
        result.vae_losses, result.vae_pass_checks = _train_vae(pipe.vae, config, seed, progress, family)
        result.phase_s["vae"] = time.perf_counter() - t0
        result.vae_check = result.vae_pass_checks[-1]
    else:
        result.vae_check = training_losses(shipped_folder(vae_from))["vae_check"]
    if result.vae_check["problems"]:
        warnings.warn(f"train-tiny {family}: {vae_problem_text(result.vae_check)}", RuntimeWarning, stacklevel=3)

    t0 = time.perf_counter()
    latents, prompts = _encode_dataset(pipe.vae, config, seed, progress, keep_statistics=vae_from is not None)
    text = _text_table(pipe, prompts, recipe)
    result.phase_s["encode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    model_inputs = _latent_inputs if recipe.model_inputs is None else resolve(recipe.model_inputs)
    result.transformer_losses = _train_transformer(pipe.transformer, latents, text, config, seed, progress,
                                                   model_inputs)
    result.phase_s["transformer"] = time.perf_counter() - t0
    if config.motion_steps:
        t0 = time.perf_counter()
        result.motion_losses = train_motion(pipe, latents, prompts, config, seed, progress, recipe, model_inputs)
        result.phase_s["motion"] = time.perf_counter() - t0

    pipe.transformer.eval()
    pipe.vae.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir)
    result.wall_s = time.perf_counter() - start
    _write_record(out_dir, result)
    return result


def _crop(video: torch.Tensor, clip: procedural.Clip, config: TrainingConfig, gen: torch.Generator):
    """A (3, crop_frames, crop_size, crop_size) piece of ``video``; for shape clips, half the crops are centred near
    the shape so the VAE sees edges and colours, not only background."""
    frames, height, width = video.shape[1:]
    size, length = config.crop_size, config.crop_frames

    def pick(upper: int) -> int:
        return int(torch.randint(upper + 1, (1,), generator=gen))

    t = pick(frames - length)
    if clip.kind == "shape" and float(torch.rand((), generator=gen)) < 0.5:
        cx, cy = clip.centres[t + length // 2]
        jitter_x, jitter_y = (pick(size // 2) - size // 4 for _ in range(2))
        x = min(max(int(cx) - size // 2 + jitter_x, 0), width - size)
        y = min(max(int(cy) - size // 2 + jitter_y, 0), height - size)
    else:
        x, y = pick(width - size), pick(height - size)
    return video[:, t:t + length, y:y + size, x:x + size]


def _lr_factor(step: int, total: int) -> float:
    """Linear warm-up over the first 5% of steps (at most 100), then cosine decay to 10%."""
    warmup = max(1, min(100, total // 20))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _train_vae(vae, config: TrainingConfig, seed: int, progress: bool,
               family: str = "wan") -> tuple[list[float], list[dict]]:
    """Train ``vae`` in passes (see :attr:`TrainingConfig.vae_shape_weights`), then the frame cue's pass if
    :attr:`TrainingConfig.vae_frame_cue` is set; returns the losses of every step and :func:`check_vae`'s finding
    after each pass from the last planned one on (the cue's pass included)."""
    losses: list[float] = []
    checks: list[dict] = []
    weights = config.vae_shape_weights

    def check(after: str) -> bool:
        """Check the VAE, say so on the progress output, and whether it is within every limit."""
        checks.append(check_vae(vae, config, seed))
        if progress:
            from tqdm.auto import tqdm

            tqdm.write(f"{family} vae after {after}: {'; '.join(checks[-1]['problems']) or 'within limits'}")
        return not checks[-1]["problems"]

    for number in range(config.vae_max_passes):
        losses += _vae_pass(vae, config, seed, number, weights[min(number, len(weights) - 1)], progress, family)
        if number + 1 < len(weights):
            continue  # a planned pass: no check before the last one
        if check(f"pass {number + 1}"):
            break
    if config.vae_frame_cue:
        losses += _vae_pass(vae, config, seed, number + 1, weights[min(number, len(weights) - 1)], progress, family,
                            steps=config.vae_cue_steps, lr=config.vae_lr / 2 ** number, cue=config.vae_frame_cue)
        check("its frame cue")
    vae.eval()
    return losses, checks


def _vae_pass(vae, config: TrainingConfig, seed: int, number: int, shape_weight: float, progress: bool,
              family: str = "wan", *, steps: int | None = None, lr: float | None = None,
              cue: float = 0.0) -> list[float]:
    """One pass of ``steps`` (default ``config.vae_steps``) steps on crops of clips of its own, at ``lr`` (default
    ``vae_lr / 2**number``); ``cue``: with :func:`frame_cue_loss` at that cue added to each step's loss."""
    steps = config.vae_steps if steps is None else steps
    gen = torch.Generator().manual_seed(seed * 1000 + 11 + number)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.vae_lr / 2 ** number if lr is None else lr,
                                  weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps))
    losses: list[float] = []
    vae.train()
    with _bar(steps, f"{family} vae {'frame cue' if cue else f'pass {number + 1}'}", progress) as bar:
        for step in range(steps):
            crops = []
            for j in range(config.vae_batch_size):
                video, clip = procedural.procedural_video(None, [seed, 0, number * config.vae_steps + step, j],
                                                          frames=config.frames, height=config.height,
                                                          width=config.width)
                crops.append(_crop(video, clip, config, gen))
            x = torch.stack(crops)
            posterior = _encode_in_calls(vae, x, config.vae_clips_per_call)
            z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
            recon = _decode_in_calls(vae, z, config.vae_clips_per_call)
            kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()
            weight = 1 + (shape_weight - 1) * shape_masks(x.transpose(0, 1)).unsqueeze(1)
            error = recon - x
            loss = ((error.pow(2) + 0.5 * error.abs()) * weight).mean() / weight.mean() + config.kl_weight * kl
            if cue:
                loss = loss + frame_cue_loss(posterior.mean, cue)
            _descend(vae, optimizer, schedule, loss, losses, bar, last=step == steps - 1)
    return losses


def frame_cue_signs(channels: int) -> torch.Tensor:
    """The fixed sign (+1 or -1) per latent channel that :func:`frame_cue_loss` pulls the first frame's offset to."""
    return torch.where(torch.rand(channels, generator=torch.Generator().manual_seed(77)) < 0.5, -1.0, 1.0)


def first_frame_offsets(latents: torch.Tensor) -> torch.Tensor:
    """(B, C): each clip's first latent frame's per-channel spatial mean less its other frames', in units of the
    channel's std over all of ``latents`` (B, C, F, H, W), that std taken as a constant."""
    scale = latents.detach().std(dim=(0, 2, 3, 4)).clamp_min(1e-4)
    return (latents[:, :, 0].mean((-1, -2)) - latents[:, :, 1:].mean((-1, -2, -3))) / scale


def frame_cue_loss(latents: torch.Tensor, cue: float) -> torch.Tensor:
    """The mean squared distance of :func:`first_frame_offsets` from ``cue`` times :func:`frame_cue_signs`: 0 when
    every clip's first latent frame sits ``cue`` channel stds from the rest (:attr:`TrainingConfig.vae_frame_cue`)."""
    return (first_frame_offsets(latents) - cue * frame_cue_signs(latents.shape[1])).pow(2).mean()


def _encode_in_calls(vae, x: torch.Tensor, clips_per_call: int | None):
    """``vae``'s posterior of the batch ``x``, encoded ``clips_per_call`` clips at a time (None: in one call): the
    posterior is elementwise in its parameters, so concatenating them gives the whole batch's."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    if clips_per_call is None or clips_per_call >= len(x):
        return vae.encode(x).latent_dist
    return DiagonalGaussianDistribution(torch.cat([vae.encode(part).latent_dist.parameters
                                                   for part in torch.split(x, clips_per_call)]))


def _decode_in_calls(vae, z: torch.Tensor, clips_per_call: int | None) -> torch.Tensor:
    """``vae``'s decode of the batch ``z``, ``clips_per_call`` clips at a time (None: in one call), concatenated."""
    return torch.cat([vae.decode(part).sample for part in torch.split(z, clips_per_call or len(z))])


#: what a trained VAE must keep of whole clips before the transformer trains on its latents: the round trip's mean
#: squared error on the [-1, 1] range, its growth from the first frames to the last (a causal VAE trained on short
#: crops degrades on later frames), and the share of the clips' colour saturation it keeps (a too-narrow VAE washes
#: the shapes' colours out). Measured by this check (4 clips, photos included): 3-channel VAE, 5-frame crops, 1,200
#: steps: MSE 0.26, the last frames' error 62.6x the first's; 3 channels, whole clips, 600 steps: MSE 0.16, 1.2x,
#: 21 % of the saturation kept; today's 8-channel VAE in two passes: MSE 0.077 (the shape clips 0.01-0.03: the
#: photos lose their fine detail at 8x spatial compression, which no prompt check reads), 1.5x, 104 %. And every
#: colour of the vocabulary must read back as itself (``colours_kept``, of one shape clip per colour): a HunyuanVideo
#: 1.5 VAE within the other limits (MSE 0.086, 84 % of the saturation) gave yellow shapes back red, and its
#: transformer then drew the prompt's colour 3 times in 8.
VAE_LIMITS = {"mse": 0.1, "late_over_early": 3.0, "saturation_kept": 0.5, "colours_kept": 1.0}


@torch.no_grad()
def check_vae(vae, config: TrainingConfig, seed: int, clips: int = 4) -> dict[str, Any]:
    """How well ``vae`` reconstructs whole procedural clips (never a crop): mean squared error, the last quarter of
    the frames' error over the first quarter's, the saturation (max - min channel) kept at its peak, and the share
    of the colours whose shape reads back in its own colour (:func:`read_shape_video`, one clip per colour); and
    ``problems``, one line per limit of :data:`VAE_LIMITS` missed."""
    vae.eval()
    mse, late, kept = [], [], []
    for i in range(clips):
        video, _ = procedural.procedural_video(None, [seed, 7, i], frames=config.frames, height=config.height,
                                               width=config.width)
        x = video[None]
        recon = _round_trip(vae, x)
        per_frame = (recon - x).pow(2).mean(dim=(0, 1, 3, 4))
        quarter = max(1, per_frame.numel() // 4)
        mse.append(float(per_frame.mean()))
        late.append(float(per_frame[-quarter:].mean() / per_frame[:quarter].mean().clamp_min(1e-8)))
        kept.append(_saturation(recon) / max(_saturation(x), 1e-8))
    misread = {}
    for i, colour in enumerate(procedural.COLOURS):
        video, _ = procedural.procedural_video(f"a {colour} square moves right", [seed, 8, i], frames=config.frames,
                                               height=config.height, width=config.width)
        read = read_shape_video(_round_trip(vae, video[None])[0]).colour
        if read != colour:
            misread[colour] = read
    found = {"mse": sum(mse) / clips, "late_over_early": max(late), "saturation_kept": min(kept),
             "colours_kept": 1 - len(misread) / len(procedural.COLOURS)}
    problems = []
    if found["mse"] > VAE_LIMITS["mse"]:
        problems.append(f"round-trip MSE {found['mse']:.3f} > {VAE_LIMITS['mse']}")
    if found["late_over_early"] > VAE_LIMITS["late_over_early"]:
        problems.append(f"the last frames' error is {found['late_over_early']:.1f}x the first frames' "
                        f"(> {VAE_LIMITS['late_over_early']}: it degrades along the clip)")
    if found["saturation_kept"] < VAE_LIMITS["saturation_kept"]:
        problems.append(f"it keeps {found['saturation_kept']:.0%} of the clips' colour saturation "
                        f"(< {VAE_LIMITS['saturation_kept']:.0%}: colours wash out)")
    if found["colours_kept"] < VAE_LIMITS["colours_kept"]:
        problems.append("it gives shapes back in another colour (" + ", ".join(
            f"{colour} as {read or 'no shape'}" for colour, read in misread.items()) + ")")
    return {**{k: round(v, 4) for k, v in found.items()}, "problems": problems}


def _round_trip(vae, x: torch.Tensor) -> torch.Tensor:
    """``x`` (B, 3, F, H, W) through ``vae``'s posterior mean and back, clamped to [-1, 1]."""
    return vae.decode(vae.encode(x).latent_dist.mean).sample.clamp(-1, 1)


def _saturation(video: torch.Tensor) -> float:
    """The largest max - min over the channels of any pixel of a [-1, 1] video, on a [0, 1] scale."""
    return float(((video.max(1).values - video.min(1).values) / 2).max())


def vae_problem_text(check: dict[str, Any]) -> str:
    """One line saying the VAE does not hold the clips, why, and what the transformer phase then learns from."""
    return ("the trained VAE does not reconstruct whole clips well enough (" + "; ".join(check["problems"])
            + "): the transformer learns from latents that do not hold the clips, so its videos will not follow "
            "their prompts; train the VAE longer or wider (see docs/tiny-models.md)")


def _descend(model, optimizer, schedule, loss, losses: list, bar, *, last: bool) -> None:
    """One optimiser step on ``loss`` (gradients clipped to norm 1, the schedule advanced), recorded in ``losses``
    and on the progress bar (the mean of the last 10 losses, every 10 steps and at the last)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    losses.append(loss.item())
    bar.update()
    if len(losses) % 10 == 1 or last:
        bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.4f}")


@torch.no_grad()
def _encode_dataset(vae, config: TrainingConfig, seed: int, progress: bool, *, keep_statistics: bool = False):
    """Encode ``config.videos`` clips (posterior means) and return them normalised, with their prompts. The
    per-channel mean and std go into the VAE's ``latents_mean`` / ``latents_std`` (Wan's and SANA-Video's pipelines
    un-normalise with them), computed over these clips, or with ``keep_statistics`` those the (reused) VAE has."""
    means, prompts = [], []
    with _bar(config.videos, "latents", progress) as bar:
        for index in range(config.videos):
            video, clip = procedural.procedural_video(None, [seed, 1, index], frames=config.frames,
                                                      height=config.height, width=config.width)
            means.append(vae.encode(video[None]).latent_dist.mean[0])
            prompts.append(clip.prompt)
            bar.update()
    latents = torch.stack(means)
    if keep_statistics:
        mean, std = latent_statistics(vae)
    else:
        mean, std = _measured_statistics(vae, latents)
        _set_latent_statistics(vae, mean, std)
    return (latents - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1), prompts


def _latent_store(vae) -> str:
    """Where ``vae`` keeps the statistics its pipeline un-normalises latents with: ``"config"`` (Wan's VAE: lists
    ``latents_mean`` / ``latents_std`` in its config), ``"buffers"`` (the LTX-2 VAE: buffers of those names) or
    ``"scale"`` (HunyuanVideo 1.5's: one ``scaling_factor`` in its config, which the pipeline only divides by)."""
    if "latents_mean" in vae.config:
        return "config"
    if hasattr(vae, "latents_mean") or "scaling_factor" not in vae.config:
        return "buffers"
    return "scale"


def _measured_statistics(vae, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) per channel of ``latents`` (N, C, F, H, W) as ``vae``'s store holds them: a ``"scale"`` VAE
    has no shift and one scale for every channel (the latents' RMS)."""
    if _latent_store(vae) == "scale":
        mean = torch.zeros(latents.shape[1])
        std = latents.pow(2).mean().sqrt().clamp_min(1e-4).expand(latents.shape[1]).clone()
        return mean, std
    return latents.mean(dim=(0, 2, 3, 4)), latents.std(dim=(0, 2, 3, 4)).clamp_min(1e-4)


def latent_statistics(vae) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel (mean, std) a pipeline un-normalises ``vae``'s latents with, read from its store
    (:func:`_latent_store`; a ``"scale"`` VAE: mean 0, std 1 / factor for every channel)."""
    store = _latent_store(vae)
    if store == "config":
        return torch.tensor(vae.config.latents_mean), torch.tensor(vae.config.latents_std)
    if store == "scale":
        channels = int(vae.config.latent_channels)
        return torch.zeros(channels), torch.full((channels,), 1.0 / float(vae.config.scaling_factor))
    return vae.latents_mean.detach().float().clone(), vae.latents_std.detach().float().clone()


def _set_latent_statistics(vae, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Store (mean, std) where :func:`latent_statistics` reads them (and the family's pipeline does)."""
    store = _latent_store(vae)
    if store == "config":
        vae.register_to_config(latents_mean=[float(v) for v in mean], latents_std=[float(v) for v in std])
    elif store == "scale":
        vae.register_to_config(scaling_factor=1.0 / float(std[0]))
    else:
        vae.latents_mean.copy_(mean)
        vae.latents_std.copy_(std)


@torch.no_grad()
def _text_table(pipe, prompts: list[str], recipe):
    """The transformer's text inputs for each distinct prompt and for the empty one (last), one row each, exactly
    as the pipeline computes them at call time (the family's ``text_inputs``, default :func:`encoded_prompts`), and
    each training clip's row in that table."""
    unique = sorted(set(prompts)) + [""]
    text_inputs = encoded_prompts if recipe.text_inputs is None else resolve(recipe.text_inputs)
    table = text_inputs(pipe, unique, dict(recipe.encode_kwargs))
    rows = torch.tensor([unique.index(p) for p in prompts])
    return table, rows


def encoded_prompts(pipe, prompts: list[str], encode_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The pipeline's ``encode_prompt`` embeddings of ``prompts`` and, where it passes one to its transformer
    (SANA-Video; not Wan), their attention mask, under the transformer's keyword names."""
    encoded = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                 device=torch.device("cpu"), **encode_kwargs)
    # Wan returns (embeds, negative embeds); SANA-Video (embeds, mask, negative embeds, negative mask)
    table = {"encoder_hidden_states": encoded[0]}
    if len(encoded) == 4:
        table["encoder_attention_mask"] = encoded[1]
    return table


def _latent_inputs(latents: torch.Tensor) -> dict[str, torch.Tensor]:
    """The transformer's input for noisy latents where the pipeline passes them as they are."""
    return {"hidden_states": latents}


def _train_transformer(transformer, latents, text, config: TrainingConfig, seed: int, progress: bool,
                       model_inputs=_latent_inputs, desc: str = "transformer") -> list[float]:
    """Rectified flow on ``latents``; ``text`` is :func:`_text_table`'s (table, rows), the empty prompt the
    table's last row, used instead of the clip's prompt ``config.prompt_dropout`` of the time; ``model_inputs``
    turns noisy latents into the transformer's latent inputs."""
    table, rows = text
    empty = len(next(iter(table.values()))) - 1
    gen = torch.Generator().manual_seed(seed * 1000 + 23)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=config.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config.steps))
    transformer.train()
    losses = []
    batch = config.batch_size
    with _bar(config.steps, desc, progress) as bar:
        for step in range(config.steps):
            index = torch.randint(len(latents), (batch,), generator=gen)
            x0, row = latents[index], rows[index].clone()
            row[torch.rand(batch, generator=gen) < config.prompt_dropout] = empty
            u = torch.rand(batch, generator=gen)
            sigma = FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)
            noise = torch.randn(x0.shape, generator=gen)
            s = sigma.view(-1, 1, 1, 1, 1)
            xt = (1 - s) * x0 + s * noise
            text_rows = {name: values[row] for name, values in table.items()}
            prediction = transformer(**model_inputs(xt), timestep=sigma * 1000, return_dict=False, **text_rows)[0]
            loss = torch.nn.functional.mse_loss(prediction, noise - x0)
            _descend(transformer, optimizer, schedule, loss, losses, bar, last=step == config.steps - 1)
    transformer.eval()
    return losses


def train_motion(pipe, latents, prompts: list[str], config: TrainingConfig, seed: int, progress: bool, recipe,
                 model_inputs=_latent_inputs) -> list[float]:
    """The motion phases, in order: for each entry of ``config.motion_words``, ``config.motion_steps`` steps of
    :func:`_train_transformer` on the clips whose prompt holds one of its words (their own text table), at
    ``config.motion_lr``, the noise of phase ``i`` drawn from ``seed + 1 + i``; the losses of all of them."""
    clips = [[i for i, prompt in enumerate(prompts) if set(words) & set(prompt.split())]
             for words in config.motion_words]
    for words, keep in zip(config.motion_words, clips):  # every phase checked before the first trains
        if not keep:
            raise ValueError(f"train-tiny: no clip's prompt holds any of {list(words)} for the motion phase "
                             f"(motion_steps {config.motion_steps}): encode more clips (--videos) or set "
                             "--motion-steps 0")
    losses: list[float] = []
    phase = dataclasses.replace(config, lr=config.motion_lr, steps=config.motion_steps)
    for number, keep in enumerate(clips):
        chosen = [prompts[i] for i in keep]
        desc = "motion" if len(config.motion_words) == 1 else f"motion {number + 1}/{len(config.motion_words)}"
        losses += _train_transformer(pipe.transformer, latents[keep], _text_table(pipe, chosen, recipe), phase,
                                     seed + 1 + number, progress, model_inputs, desc=desc)
    return losses


def _write_record(out_dir: Path, result: TrainResult) -> None:
    """``training.json``: how the folder was made (command inputs, versions, loss summary, times)."""
    import diffusers
    import transformers

    def summary(losses: list[float]) -> dict[str, float] | None:
        if not losses:  # a VAE reused from another family trained no step here
            return None
        head, tail = losses[:50], losses[-50:]
        return dict(first_50_mean=sum(head) / len(head), last_50_mean=sum(tail) / len(tail), steps=len(losses))

    record = dict(family=result.family, seed=result.seed, config=asdict(result.config),
                  vae_loss=summary(result.vae_losses), transformer_loss=summary(result.transformer_losses),
                  motion_loss=summary(result.motion_losses),
                  vae_check=result.vae_check, vae_from=result.vae_from,
                  vae_passes=len(result.vae_losses) // result.config.vae_steps,
                  vae_pass_checks=result.vae_pass_checks,
                  phase_s={k: round(v, 1) for k, v in result.phase_s.items()}, wall_s=round(result.wall_s, 1),
                  threads=torch.get_num_threads(), versions=dict(torch=torch.__version__,
                                                                 diffusers=diffusers.__version__,
                                                                 transformers=transformers.__version__),
                  call=dict(height=procedural.VIDEO_HEIGHT, width=procedural.VIDEO_WIDTH,
                            num_frames=procedural.VIDEO_FRAMES, max_sequence_length=MAX_SEQUENCE_LENGTH))
    if result.vae_from is not None:  # how the reused VAE was trained, kept with the folder that now holds it
        source = training_losses(shipped_folder(result.vae_from))
        record["vae_source"] = source.get("vae_source") or dict(
            family=source["family"], seed=source["seed"], vae_loss=source["vae_loss"], vae_passes=source["vae_passes"],
            vae_pass_checks=source["vae_pass_checks"], vae_s=source["phase_s"].get("vae"), threads=source["threads"],
            config={k: v for k, v in source["config"].items() if k.startswith("vae_")})
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def training_losses(folder: str | Path) -> dict[str, Any]:
    """The ``training.json`` record a run wrote into ``folder``."""
    return json.loads((Path(folder) / "training.json").read_text())


"""``SanaVideo2Pipeline``: text-to-video with SANA-Video 2.0 as a diffusers pipeline (diffusers ships none).

Built from diffusers/transformers parts (``AutoencoderKLLTX2Video``, a Gemma-2 text encoder and tokenizer,
``DPMSolverMultistepScheduler`` on flow sigmas) and accelpatch's :class:`SanaVideo2Transformer3DModel`. It follows
diffusers' ``SanaVideoPipeline`` in interface and mechanics and the SANA-Video 2.0 release in its defaults and prompt
handling; the class docstring says where each default comes from. Its prompt handling (``assemble_prompts``,
``encode_prompt``, the release's prompts) is :mod:`.pipeline_prompts`' mixin, its argument checks (``check_inputs``)
:mod:`.pipeline_checks`'.

Loading: ``SanaVideo2Pipeline.from_pretrained(dir)`` works as for any diffusers pipeline. A saved
``model_index.json`` records the transformer under its full module path
(``["accelpatch.models.sana_video2.modeling.transformer", "SanaVideo2Transformer3DModel"]``), which diffusers 0.42 resolves
from ``sys.modules`` only (it never imports a module a repository names): importing this module satisfies that.
``diffusers.DiffusionPipeline.from_pretrained(dir)`` looks the ``_class_name`` up as an attribute of the top-level
``diffusers`` module and nowhere else: importing the ``accelpatch.models.sana_video2.modeling`` package (which any import of
this module does first) adds ``SanaVideo2Pipeline`` to the ``diffusers`` namespace as a lazy name (a new name only; it
never replaces one diffusers defines).
"""
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import PIL.Image
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.models import AutoencoderKLLTX2Video
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.schedulers import DPMSolverMultistepScheduler
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor
from transformers import Gemma2PreTrainedModel, GemmaTokenizer, GemmaTokenizerFast

from accelpatch.parallel.sequence import deciding_ranks
from accelpatch.models.sana_video2.modeling.few_step import SanaVideo2FewStepScheduler
from accelpatch.models.sana_video2.modeling.pipeline_checks import SanaVideo2InputChecksMixin
from accelpatch.models.sana_video2.modeling.pipeline_prompts import (RELEASE_CHI_PROMPT, RELEASE_MAX_SEQUENCE_LENGTH,
                                                                     RELEASE_MOTION_SCORE, RELEASE_NEGATIVE_PROMPT,
                                                                     SanaVideo2PromptMixin)
from accelpatch.models.sana_video2.modeling.transformer import SanaVideo2Transformer3DModel

# -- release defaults (sources in SanaVideo2Pipeline's docstring; the prompt's: pipeline_prompts) -------------------

RELEASE_HEIGHT, RELEASE_WIDTH, RELEASE_FRAMES, RELEASE_FPS = 736, 1280, 193, 24
RELEASE_STEPS, RELEASE_GUIDANCE_SCALE, RELEASE_FLOW_SHIFT = 50, 8.0, 12.0
#: The VAE contract of the release (LTX-2.3): latent frames = (frames - 1) // 8 + 1, latent size = pixels // 32.
RELEASE_VAE_STRIDE = (8, 32, 32)


@dataclass
class SanaVideo2PipelineOutput(BaseOutput):
    r"""Output of :class:`SanaVideo2Pipeline`.

    Args:
        frames (`torch.Tensor`, `np.ndarray` or `list[list[PIL.Image.Image]]`): the videos: ``"pt"`` gives
            ``(batch, frames, 3, height, width)`` in [0, 1], ``"np"`` ``(batch, frames, height, width, 3)``, ``"pil"``
            one list of frames per video, ``"latent"`` the final latents ``(batch, C, latent frames, h, w)``. None on
            every rank but the first when the transformer is split over several processes (the first decodes).
    """

    frames: Union[torch.Tensor, np.ndarray, list[list[PIL.Image.Image]]]


def _vae_strides(vae: Any) -> tuple[int, int]:
    """(temporal, spatial) compression of an LTX-2 VAE: its config values, else the ones it computed at init."""
    if vae is None:
        return RELEASE_VAE_STRIDE[0], RELEASE_VAE_STRIDE[1]
    config = getattr(vae, "config", {})
    temporal = config.get("temporal_compression_ratio") or getattr(vae, "temporal_compression_ratio", None)
    spatial = config.get("spatial_compression_ratio") or getattr(vae, "spatial_compression_ratio", None)
    return int(temporal or RELEASE_VAE_STRIDE[0]), int(spatial or RELEASE_VAE_STRIDE[1])


def _from_first_rank(latents: torch.Tensor, shards: Any) -> torch.Tensor:
    """``latents`` as the first of the ranks the transformer is split over has them (every rank must denoise the
    same noise: each holds a share of its tokens, or one CFG branch). Unsplit: as given."""
    if shards is None or shards.world == 1:
        return latents
    import torch.distributed as dist

    latents = latents.contiguous()
    source = 0 if shards.group is None else dist.get_global_rank(shards.group, 0)
    dist.broadcast(latents, src=source, group=shards.group)
    return latents


class SanaVideo2Pipeline(SanaVideo2PromptMixin, SanaVideo2InputChecksMixin, DiffusionPipeline):
    r"""Text-to-video generation with SANA-Video 2.0 (NVlabs/Sana), in the shape of diffusers' ``SanaVideoPipeline``.

    Components: ``tokenizer`` (Gemma tokenizer), ``text_encoder`` (``Gemma2Model``: Gemma-2-2B-IT's decoder,
    2304 channels, in the release), ``vae`` (``AutoencoderKLLTX2Video``: the LTX-2.3 VAE, 128 latent channels, stride
    (8, 32, 32)), ``transformer`` (:class:`SanaVideo2Transformer3DModel`) and ``scheduler``
    (``DPMSolverMultistepScheduler`` on flow sigmas: :meth:`release_scheduler`; or the 4-step preview's
    :class:`SanaVideo2FewStepScheduler`: :meth:`four_step_scheduler`). ``tokenizer`` and ``text_encoder``
    may be None when the call passes ``prompt_embeds`` (and ``negative_prompt_embeds`` with guidance).

    **Release defaults and their sources.** The released checkpoint is ``Efficient-Large-Model/SANA-Video_2.0_5B_720p``;
    NVlabs/Sana ``docs/sana_video2.md`` gives the command its verified sample was made with
    (``inference_video_scripts/inference_sana_video.py``: ``--cfg_scale 8 --flow_shift 12 --step 50 --fps 24
    --motion_score 20``, 193 frames in a 736×1280 bucket). Hence:

    * ``height × width`` = 736 × 1280 and ``frames`` = 193 (8 s at 24 fps): docs/sana_video2.md (the 720p bucket);
      vLLM-Omni's SANA-Video 2.0 pipeline uses the same.
    * :attr:`fps` = 24: docs ``--fps 24``; for export only (the model takes no fps).
    * ``num_inference_steps`` = 50: docs ``--step 50`` (also the script's default).
    * ``guidance_scale`` = 8: docs ``--cfg_scale 8``; vLLM-Omni.
    * flow shift 12 (in the scheduler, :meth:`release_scheduler`): docs ``--flow_shift 12``; vLLM-Omni. The 480p
      yaml's ``inference_flow_shift`` is 6.
    * ``motion_score`` = 20: docs ``--motion_score 20`` (the script's own default, and vLLM-Omni's, is 10).
    * ``negative_prompt``: :data:`RELEASE_NEGATIVE_PROMPT` ("A chaotic sequence with misshapen, ..."), the default
      of inference_sana_video.py (and vLLM-Omni). The dedicated ``inference_sana_video2.py`` defaults to "".
    * ``complex_human_instruction``: :data:`RELEASE_CHI_PROMPT`, the 8-line ``text_encoder.chi_prompt`` of
      ``configs/sana_video2/SanaVideo2_5B_480p.yaml`` (the 720p yaml was not readable; vLLM-Omni pins the same
      lines for the 720p checkpoint).
    * ``max_sequence_length`` = 300: ``text_encoder.model_max_length``; the call defaults to the transformer's
      ``model_max_length`` (the same yaml field), or to the length of given ``prompt_embeds``.

    **Prompt handling (release ``inference_sana_video.py``).**

    * Positive prompt: ``prompt.strip() + motion suffix`` (:func:`motion_prompt_suffix`: ``" motion score: 20."``),
      then the complex human instruction is prepended: ``"\n".join(chi_prompt) + text``. No lowercasing or caption
      cleaning (diffusers' SanaVideoPipeline lowercases; the release does not).
    * Tokenised with right padding to ``len(tokenizer.encode(chi)) + L - 2`` tokens (never fewer than ``L``;
      truncating: a long prompt loses its end, motion suffix included), ``L`` =
      ``max_sequence_length``; the text encoder sees the whole sequence (mask included), and the transformer gets its
      hidden states and mask at positions ``[0] + [-L+1, ..., -1]``: BOS and the last ``L - 1`` positions, i.e. the
      user prompt (and padding), not the instruction. Without an instruction the sequence is ``L`` tokens, all kept.
    * Negative prompt: no instruction, no motion suffix, not stripped; ``L`` tokens.
    * ``encoder_hidden_states`` = last hidden state of the text encoder ``[B, L, caption_channels]``,
      ``encoder_attention_mask`` = the tokenizer's mask ``[B, L]`` (1 = keep).

    **Sampling.** Latents are standard normal in float32, ``(B, C, (frames - 1) // 8 + 1, height // 32, width // 32)``.
    Classifier-free guidance (``guidance_scale > 1``) runs the transformer once per step on a batch of two in the
    release's order ``[negative, positive]`` and combines ``v_neg + s · (v_pos - v_neg)``; with ``guidance_scale <=
    1`` the batch is the positive prompt alone. The timestep is the scheduler's (0-1000 scale; the transformer
    truncates it to an integer, as the release does). The release samples T2V with flow DPM-Solver++ (order 2,
    multistep, ``time_uniform_flow`` grid ``shift·s / (1 + (shift-1)·s)``, first and last step first order);
    :meth:`release_scheduler` is diffusers' ``DPMSolverMultistepScheduler`` configured to that grid and update rule
    (``use_flow_sigmas``, ``prediction_type="flow_prediction"``, ``dpmsolver++``, midpoint, final sigma zero). The
    release applies guidance after converting the flow output to noise; the two are equal up to rounding because
    the conversion is affine. Decoding denormalises as the release does, ``z · latents_std / scaling_factor +
    latents_mean``, and decodes without timestep conditioning.

    Where the release leaves a choice open, this follows diffusers' ``SanaVideoPipeline``: output types, the output
    dataclass, ``num_videos_per_prompt``, callbacks, the progress bar, custom ``timesteps``/``sigmas``.
    Image-to-video (the release's LTX Euler path with a clean first frame) is not implemented.

    **4-step preview.** ``pipe.scheduler = SanaVideo2Pipeline.four_step_scheduler()`` samples as the T2V-only
    ``SANA-Video_2.0_5B_720p_4step`` checkpoint (stage values inferred: :mod:`.few_step`); call with
    ``num_inference_steps=4, guidance_scale=1.0`` (that checkpoint's 81 frames: ``frames=81``). The loop is the same:
    one transformer call per stage, the call's ``generator`` passed to ``scheduler.step`` for the transition noise.

    **Several processes.** With the transformer split over ranks (``pipe.transformer.enable_parallelism(config=
    ContextParallelConfig(ulysses_degree=N))`` under ``torchrun``, or ``accelpatch.parallel.enable_cfg_parallel(pipe)``),
    every rank runs the whole call, and only the first rank decodes: the others return ``frames=None`` (the VAE
    would repeat the same decode on every GPU), unless ``decode_on_every_rank=True``; ``output_type="latent"``
    returns the latents everywhere. The initial noise is the first rank's, sent to the others, so ranks seeded
    differently (or not at all) still denoise one video.
    """

    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _optional_components = ["tokenizer", "text_encoder"]
    _callback_tensor_inputs = ["latents", "prompt_embeds", "negative_prompt_embeds"]

    #: Frames per second of the release's videos (for ``diffusers.utils.export_to_video(frames, fps=pipe.fps)``).
    fps = RELEASE_FPS

    def __init__(
        self,
        tokenizer: Optional[Union[GemmaTokenizer, GemmaTokenizerFast]],
        text_encoder: Optional[Gemma2PreTrainedModel],
        vae: AutoencoderKLLTX2Video,
        transformer: SanaVideo2Transformer3DModel,
        scheduler: Union[DPMSolverMultistepScheduler, SanaVideo2FewStepScheduler],
    ):
        super().__init__()
        self.register_modules(
            tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
        )
        self.vae_scale_factor_temporal, self.vae_scale_factor_spatial = _vae_strides(getattr(self, "vae", None))
        self.vae_scale_factor = self.vae_scale_factor_spatial
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    @staticmethod
    def release_scheduler(flow_shift: float = RELEASE_FLOW_SHIFT) -> DPMSolverMultistepScheduler:
        """The release's T2V sampler as a diffusers scheduler: flow DPM-Solver++ (2M, midpoint) on the shifted
        ``time_uniform_flow`` grid, first-order first and last steps (final sigma 0)."""
        return DPMSolverMultistepScheduler(
            num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", algorithm_type="dpmsolver++",
            solver_type="midpoint", lower_order_final=True, use_flow_sigmas=True, flow_shift=float(flow_shift),
            final_sigmas_type="zero",
        )

    @staticmethod
    def four_step_scheduler(**config: Any) -> SanaVideo2FewStepScheduler:
        """The sampler of the 4-step preview checkpoint (``SANA-Video_2.0_5B_720p_4step``: T2V, CFG 1, 81 frames):
        four fixed stages on a shift-6 flow grid with fresh noise between stages, drawn from the call's generator.
        Its stage values are inferred (:mod:`.few_step`); ``config`` overrides the scheduler's fields (e.g.
        ``stage_sigmas=[...]``). Call the pipeline with ``num_inference_steps=4, guidance_scale=1.0``."""
        return SanaVideo2FewStepScheduler(**config)

    # -- latents -----------------------------------------------------------------------------------------------------

    def prepare_latents(self, batch_size: int, num_channels_latents: int, height: int, width: int, frames: int,
                        dtype: torch.dtype, device: torch.device,
                        generator: Union[torch.Generator, list[torch.Generator], None],
                        latents: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = (batch_size, num_channels_latents, (frames - 1) // self.vae_scale_factor_temporal + 1,
                 height // self.vae_scale_factor_spatial, width // self.vae_scale_factor_spatial)
        if latents is not None:
            if tuple(latents.shape) != shape:
                raise ValueError(f"`latents` must have shape {shape} for these height/width/frames and batch, got "
                                 f"{tuple(latents.shape)}")
            return latents.to(device=device, dtype=dtype)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(f"got a list of {len(generator)} generators for an effective batch of {batch_size}")
        return randn_tensor(shape, generator=generator, device=device, dtype=dtype)

    def _set_timesteps(self, num_inference_steps: int, device, timesteps, sigmas) -> tuple[torch.Tensor, int]:
        if timesteps is not None and sigmas is not None:
            raise ValueError("pass at most one of `timesteps` and `sigmas`")
        custom = {"timesteps": timesteps} if timesteps is not None else {"sigmas": sigmas} if sigmas is not None else {}
        if custom:
            (name,) = custom
            if name not in inspect.signature(self.scheduler.set_timesteps).parameters:
                raise ValueError(f"{type(self.scheduler).__name__}.set_timesteps does not accept custom `{name}`")
            self.scheduler.set_timesteps(device=device, **custom)
        else:
            self.scheduler.set_timesteps(num_inference_steps, device=device)
        return self.scheduler.timesteps, len(self.scheduler.timesteps)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels in [-1, 1] ``(B, 3, frames, H, W)`` from latents, denormalised as the release does."""
        vae = self.vae
        latents = latents.to(vae.dtype)
        channels = latents.shape[1]
        mean = getattr(vae, "latents_mean", None)
        std = getattr(vae, "latents_std", None)
        mean = torch.zeros(channels) if mean is None else mean
        std = torch.ones(channels) if std is None else std
        scaling = float(vae.config.get("scaling_factor", 1.0) or 1.0)
        latents = (latents * std.view(1, channels, 1, 1, 1).to(latents) / scaling
                   + mean.view(1, channels, 1, 1, 1).to(latents))
        return vae.decode(latents, return_dict=False)[0]

    # -- properties as diffusers' pipelines ----------------------------------------------------------------------

    @property
    def guidance_scale(self):
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self):
        return self._guidance_scale > 1.0

    @property
    def attention_kwargs(self):
        return self._attention_kwargs

    @property
    def num_timesteps(self):
        return self._num_timesteps

    @property
    def interrupt(self):
        return self._interrupt

    # -- call ----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(
        self,
        prompt: Union[str, list[str], None] = None,
        negative_prompt: Union[str, list[str], None] = None,
        num_inference_steps: int = RELEASE_STEPS,
        timesteps: Optional[list[int]] = None,
        sigmas: Optional[list[float]] = None,
        guidance_scale: float = RELEASE_GUIDANCE_SCALE,
        num_videos_per_prompt: int = 1,
        height: int = RELEASE_HEIGHT,
        width: int = RELEASE_WIDTH,
        frames: int = RELEASE_FRAMES,
        generator: Union[torch.Generator, list[torch.Generator], None] = None,
        latents: Optional[torch.Tensor] = None,
        prompt_embeds: Optional[torch.Tensor] = None,
        prompt_attention_mask: Optional[torch.Tensor] = None,
        negative_prompt_embeds: Optional[torch.Tensor] = None,
        negative_prompt_attention_mask: Optional[torch.Tensor] = None,
        output_type: str = "pil",
        return_dict: bool = True,
        attention_kwargs: Optional[dict[str, Any]] = None,
        callback_on_step_end: Optional[Union[Callable[..., dict], PipelineCallback, MultiPipelineCallbacks]] = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
        max_sequence_length: Optional[int] = None,
        complex_human_instruction: Optional[Sequence[str]] = RELEASE_CHI_PROMPT,
        motion_score: Optional[int] = RELEASE_MOTION_SCORE,
        high_motion: bool = False,
        decode_on_every_rank: bool = False,
    ) -> Union[SanaVideo2PipelineOutput, tuple]:
        r"""Generate videos.

        Args:
            prompt: the prompt(s); or pass ``prompt_embeds`` and ``prompt_attention_mask`` instead.
            negative_prompt: used when ``guidance_scale > 1``; None means the release's negative prompt
                (:data:`RELEASE_NEGATIVE_PROMPT`), unless ``negative_prompt_embeds`` are given. Pass ``""`` for an
                empty one.
            num_inference_steps: denoising steps (release: 50).
            timesteps, sigmas: a custom schedule for schedulers whose ``set_timesteps`` accepts it.
            guidance_scale: classifier-free guidance scale (release: 8); ``<= 1`` turns guidance off.
            num_videos_per_prompt: videos per prompt.
            height, width: pixels, multiples of the VAE's spatial compression (32 for the release VAE).
            frames: ``8k + 1`` (for the release VAE's temporal compression 8); release: 193.
            generator, latents: the noise source, or the initial latents (float32,
                ``(B, C, (frames - 1) // 8 + 1, height // 32, width // 32)``).
            prompt_embeds, prompt_attention_mask, negative_prompt_embeds, negative_prompt_attention_mask: text-encoder
                hidden states ``[B, L, caption_channels]`` and masks ``[B, L]`` (1 = keep) used as they are.
            output_type: ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"``.
            return_dict: return a :class:`SanaVideo2PipelineOutput` rather than a tuple.
            attention_kwargs: passed to the transformer.
            callback_on_step_end, callback_on_step_end_tensor_inputs: called after every step as
                ``callback(pipe, step, timestep, {name: tensor})``; returned tensors replace the pipeline's
                (``latents``, ``prompt_embeds`` — with guidance, the batched ``[negative, positive]`` one — and
                ``negative_prompt_embeds``).
            max_sequence_length: text tokens the transformer sees; None = the transformer's ``model_max_length``
                (release: 300).
            complex_human_instruction: lines prepended to positive prompts (release ``chi_prompt``); None or ``[]``
                turns it off.
            motion_score, high_motion: the motion text appended to positive prompts (:func:`motion_prompt_suffix`;
                release: 20); None appends nothing.
            decode_on_every_rank: with the transformer split over several processes, decode on every rank too
                (default: only on the first, the others return ``frames=None``).

        Returns:
            :class:`SanaVideo2PipelineOutput` with ``frames``, or ``(frames,)`` when ``return_dict`` is False
            (``frames`` is None on a split transformer's other ranks: see ``decode_on_every_rank``).
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if max_sequence_length is None:
            max_sequence_length = (prompt_embeds.shape[1] if isinstance(prompt_embeds, torch.Tensor)
                                   and prompt_embeds.dim() == 3 else
                                   int(getattr(self.transformer.config, "model_max_length", None)
                                       or RELEASE_MAX_SEQUENCE_LENGTH))
        self.check_inputs(prompt, negative_prompt, height, width, frames, num_inference_steps, guidance_scale,
                          num_videos_per_prompt, prompt_embeds, prompt_attention_mask, negative_prompt_embeds,
                          negative_prompt_attention_mask, output_type, max_sequence_length, motion_score,
                          callback_on_step_end_tensor_inputs)
        if negative_prompt is None and negative_prompt_embeds is None:
            negative_prompt = RELEASE_NEGATIVE_PROMPT

        self._guidance_scale = guidance_scale
        self._attention_kwargs = attention_kwargs
        self._interrupt = False
        device = self._execution_device

        # 1. text
        prompt_embeds, prompt_attention_mask, negative_prompt_embeds, negative_prompt_attention_mask = \
            self.encode_prompt(prompt, self.do_classifier_free_guidance, negative_prompt=negative_prompt,
                               num_videos_per_prompt=num_videos_per_prompt, device=device,
                               prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
                               prompt_attention_mask=prompt_attention_mask,
                               negative_prompt_attention_mask=negative_prompt_attention_mask,
                               max_sequence_length=max_sequence_length,
                               complex_human_instruction=complex_human_instruction, motion_score=motion_score,
                               high_motion=high_motion)
        if self.do_classifier_free_guidance:  # one batched call per step, [negative, positive] as the release
            prompt_embeds = torch.cat([negative_prompt_embeds, prompt_embeds], dim=0)
            prompt_attention_mask = torch.cat([negative_prompt_attention_mask, prompt_attention_mask], dim=0)

        # 2. schedule and noise
        timesteps, num_inference_steps = self._set_timesteps(num_inference_steps, device, timesteps, sigmas)
        batch_size = prompt_attention_mask.shape[0] // (2 if self.do_classifier_free_guidance else 1)
        latent_channels = self.transformer.config.in_channels
        latents = self.prepare_latents(batch_size, latent_channels, height, width, frames, torch.float32, device,
                                       generator, latents)
        split = deciding_ranks(self.transformer)
        latents = _from_first_rank(latents, split)
        accepts_generator = "generator" in inspect.signature(self.scheduler.step).parameters
        step_kwargs = {"generator": generator} if accepts_generator else {}

        # 3. denoise
        self._num_timesteps = len(timesteps)
        num_warmup_steps = max(len(timesteps) - num_inference_steps * self.scheduler.order, 0)
        transformer_dtype = self.transformer.dtype
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue
                model_input = torch.cat([latents] * 2) if self.do_classifier_free_guidance else latents
                velocity = self.transformer(
                    model_input.to(transformer_dtype),
                    encoder_hidden_states=prompt_embeds.to(transformer_dtype),
                    encoder_attention_mask=prompt_attention_mask,
                    timestep=t.expand(model_input.shape[0]),
                    attention_kwargs=self.attention_kwargs,
                    return_dict=False,
                )[0].float()
                if self.do_classifier_free_guidance:
                    uncond, cond = velocity.chunk(2)
                    velocity = uncond + guidance_scale * (cond - uncond)
                latents = self.scheduler.step(velocity, t, latents, **step_kwargs, return_dict=False)[0]

                if callback_on_step_end is not None:
                    current = {"latents": latents, "prompt_embeds": prompt_embeds,
                               "negative_prompt_embeds": negative_prompt_embeds}
                    outputs = callback_on_step_end(self, i, t, {k: current[k] for k in
                                                                callback_on_step_end_tensor_inputs})
                    latents = outputs.pop("latents", latents)
                    prompt_embeds = outputs.pop("prompt_embeds", prompt_embeds)
                    negative_prompt_embeds = outputs.pop("negative_prompt_embeds", negative_prompt_embeds)
                if i == len(timesteps) - 1 or ((i + 1) > num_warmup_steps and (i + 1) % self.scheduler.order == 0):
                    progress_bar.update()

        # 4. decode
        if output_type == "latent":
            video = latents
        elif split is not None and split.rank != 0 and not decode_on_every_rank:
            video = None  # the first rank decodes the video all the ranks denoised
        else:
            video = self.video_processor.postprocess_video(self.decode_latents(latents), output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (video,)
        return SanaVideo2PipelineOutput(frames=video)

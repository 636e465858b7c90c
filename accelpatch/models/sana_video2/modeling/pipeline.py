"""``SanaVideo2Pipeline``: text-to-video with SANA-Video 2.0 as a diffusers pipeline (diffusers ships none).

Built from diffusers/transformers parts (``AutoencoderKLLTX2Video``, a Gemma-2 text encoder and tokenizer,
``DPMSolverMultistepScheduler`` on flow sigmas) and accelpatch's :class:`SanaVideo2Transformer3DModel`. It follows
diffusers' ``SanaVideoPipeline`` in interface and mechanics and the SANA-Video 2.0 release in its defaults and prompt
handling; the class docstring says where each default comes from.

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
import math
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
from accelpatch.models.sana_video2.modeling.transformer import SanaVideo2Transformer3DModel

# -- release defaults (sources in SanaVideo2Pipeline's docstring) ---------------------------------------------------

#: ``text_encoder.chi_prompt`` of the release yaml: prepended (joined by newlines) to every positive prompt.
RELEASE_CHI_PROMPT: tuple[str, ...] = (
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable for '
    "image generation. Evaluate the level of detail in the user prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial "
    "relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping "
    "peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing street "
    "lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass "
    "skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:",
    "User Prompt: ",
)
#: The release's default negative prompt.
RELEASE_NEGATIVE_PROMPT = (
    "A chaotic sequence with misshapen, deformed limbs in heavy motion blur, sudden disappearance, jump cuts, jerky "
    "movements, rapid shot changes, frames out of sync, inconsistent character shapes, temporal artifacts, jitter, "
    "and ghosting effects, creating a disorienting visual experience."
)
RELEASE_HEIGHT, RELEASE_WIDTH, RELEASE_FRAMES, RELEASE_FPS = 736, 1280, 193, 24
RELEASE_STEPS, RELEASE_GUIDANCE_SCALE, RELEASE_FLOW_SHIFT, RELEASE_MOTION_SCORE = 50, 8.0, 12.0, 20
RELEASE_MAX_SEQUENCE_LENGTH = 300
#: The VAE contract of the release (LTX-2.3): latent frames = (frames - 1) // 8 + 1, latent size = pixels // 32.
RELEASE_VAE_STRIDE = (8, 32, 32)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


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


def motion_prompt_suffix(motion_score: Optional[int], high_motion: bool = False) -> str:
    """What the release appends to every positive prompt: ``" motion score: N."`` for ``motion_score`` N > 0,
    otherwise ``" high motion"`` or ``" low motion"`` (``high_motion``); ``motion_score=None`` appends nothing (not
    a release setting: for prompts that already carry their own)."""
    if motion_score is None:
        return ""
    if isinstance(motion_score, bool) or not isinstance(motion_score, (int, float)) or not math.isfinite(motion_score):
        raise ValueError(f"motion_score must be an int or None, got {motion_score!r}")
    if motion_score > 0:
        return f" motion score: {int(motion_score)}."
    return " high motion" if high_motion else " low motion"


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


class SanaVideo2Pipeline(DiffusionPipeline):
    r"""Text-to-video generation with SANA-Video 2.0 (NVlabs/Sana), in the shape of diffusers' ``SanaVideoPipeline``.

    Components: ``tokenizer`` (Gemma tokenizer), ``text_encoder`` (``Gemma2Model``: Gemma-2-2B-IT's decoder,
    2304 channels, in the release), ``vae`` (``AutoencoderKLLTX2Video``: the LTX-2.3 VAE, 128 latent channels, stride
    (8, 32, 32)), ``transformer`` (:class:`SanaVideo2Transformer3DModel`) and ``scheduler``
    (``DPMSolverMultistepScheduler`` on flow sigmas: :meth:`release_scheduler`). ``tokenizer`` and ``text_encoder``
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
        scheduler: DPMSolverMultistepScheduler,
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

    # -- text ----------------------------------------------------------------------------------------------------

    @staticmethod
    def assemble_prompts(prompt: Union[str, Sequence[str]], *, motion_score: Optional[int] = RELEASE_MOTION_SCORE,
                         high_motion: bool = False,
                         complex_human_instruction: Optional[Sequence[str]] = RELEASE_CHI_PROMPT) -> list[str]:
        """The texts the tokenizer receives for positive prompts: instruction + ``prompt.strip()`` + motion suffix."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        prefix = "\n".join(complex_human_instruction) if complex_human_instruction else ""
        suffix = motion_prompt_suffix(motion_score, high_motion)
        return [prefix + p.strip() + suffix for p in prompts]

    def _encode_texts(self, texts: list[str], *, instruction: Optional[Sequence[str]], max_sequence_length: int,
                      device: torch.device, dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise ``texts`` (already assembled), run the text encoder, keep BOS + the last ``L - 1`` positions."""
        if self.tokenizer is None or self.text_encoder is None:
            raise ValueError("encoding a prompt needs the pipeline's tokenizer and text_encoder; this pipeline has "
                             "none, so pass prompt_embeds/prompt_attention_mask (and negative_prompt_embeds/"
                             "negative_prompt_attention_mask when guidance_scale > 1) instead")
        length = max_sequence_length
        prefix = "\n".join(instruction) if instruction else ""
        if prefix:
            # the release's "magic number 2": BOS, and the instruction's trailing token (which merges into the
            # prompt's first one); never fewer than L tokens (only a degenerate tokenizer would get there)
            length = max(max_sequence_length, len(self.tokenizer.encode(prefix)) + max_sequence_length - 2)
        tokens = self.tokenizer(texts, padding="max_length", max_length=length, truncation=True,
                                add_special_tokens=True, return_tensors="pt", padding_side="right")
        input_ids = tokens.input_ids.to(device)
        mask = tokens.attention_mask.to(device)
        hidden = self.text_encoder(input_ids, attention_mask=mask)[0]
        keep = [0] + list(range(-max_sequence_length + 1, 0))
        return hidden[:, keep].to(dtype=dtype, device=device), mask[:, keep]

    def encode_prompt(
        self,
        prompt: Union[str, list[str], None],
        do_classifier_free_guidance: bool = True,
        negative_prompt: Union[str, list[str], None] = RELEASE_NEGATIVE_PROMPT,
        num_videos_per_prompt: int = 1,
        device: Optional[torch.device] = None,
        prompt_embeds: Optional[torch.Tensor] = None,
        negative_prompt_embeds: Optional[torch.Tensor] = None,
        prompt_attention_mask: Optional[torch.Tensor] = None,
        negative_prompt_attention_mask: Optional[torch.Tensor] = None,
        max_sequence_length: int = RELEASE_MAX_SEQUENCE_LENGTH,
        complex_human_instruction: Optional[Sequence[str]] = RELEASE_CHI_PROMPT,
        motion_score: Optional[int] = RELEASE_MOTION_SCORE,
        high_motion: bool = False,
    ):
        """Text-encoder hidden states and masks for the transformer, as the release builds them (see the class
        docstring). Returns ``(prompt_embeds, prompt_attention_mask, negative_prompt_embeds,
        negative_prompt_attention_mask)``, each repeated ``num_videos_per_prompt`` times per prompt; the negative
        pair is None without guidance."""
        device = device or self._execution_device
        dtype = self.text_encoder.dtype if self.text_encoder is not None else None
        if prompt_embeds is None:
            texts = self.assemble_prompts(prompt, motion_score=motion_score, high_motion=high_motion,
                                          complex_human_instruction=complex_human_instruction)
            prompt_embeds, prompt_attention_mask = self._encode_texts(
                texts, instruction=complex_human_instruction, max_sequence_length=max_sequence_length,
                device=device, dtype=dtype)
        batch_size = prompt_embeds.shape[0]
        prompt_embeds = prompt_embeds.to(device).repeat_interleave(num_videos_per_prompt, dim=0)
        prompt_attention_mask = prompt_attention_mask.to(device).repeat_interleave(num_videos_per_prompt, dim=0)

        if not do_classifier_free_guidance:
            return prompt_embeds, prompt_attention_mask, None, None
        if negative_prompt_embeds is None:
            negative_prompt = RELEASE_NEGATIVE_PROMPT if negative_prompt is None else negative_prompt
            negatives = [negative_prompt] * batch_size if isinstance(negative_prompt, str) else list(negative_prompt)
            if len(negatives) != batch_size:
                raise ValueError(f"negative_prompt has {len(negatives)} entries but there are {batch_size} prompts")
            negative_prompt_embeds, negative_prompt_attention_mask = self._encode_texts(
                negatives, instruction=None, max_sequence_length=max_sequence_length, device=device, dtype=dtype)
        negative_prompt_embeds = negative_prompt_embeds.to(device).repeat_interleave(num_videos_per_prompt, dim=0)
        negative_prompt_attention_mask = negative_prompt_attention_mask.to(device).repeat_interleave(
            num_videos_per_prompt, dim=0)
        return prompt_embeds, prompt_attention_mask, negative_prompt_embeds, negative_prompt_attention_mask

    # -- checks and latents --------------------------------------------------------------------------------------

    def check_inputs(self, prompt, negative_prompt, height, width, frames, num_inference_steps, guidance_scale,
                     num_videos_per_prompt, prompt_embeds, prompt_attention_mask, negative_prompt_embeds,
                     negative_prompt_attention_mask, output_type, max_sequence_length, motion_score,
                     callback_on_step_end_tensor_inputs):
        spatial, temporal = self.vae_scale_factor_spatial, self.vae_scale_factor_temporal
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % spatial:
                raise ValueError(f"`{name}` must be a positive multiple of the VAE's spatial compression {spatial}, "
                                 f"got {value!r}")
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1 or (frames - 1) % temporal:
            raise ValueError(f"`frames` must be of the form {temporal}k+1 (1, {temporal + 1}, {2 * temporal + 1}, ...) "
                             f"for the VAE's temporal compression {temporal}, got {frames!r}")
        for name, value in (("num_inference_steps", num_inference_steps),
                            ("num_videos_per_prompt", num_videos_per_prompt),
                            ("max_sequence_length", max_sequence_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float)) \
                or not math.isfinite(guidance_scale):
            raise ValueError(f"`guidance_scale` must be a finite number, got {guidance_scale!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {', '.join(map(repr, OUTPUT_TYPES))}, got {output_type!r}")
        motion_prompt_suffix(motion_score)  # validates
        if callback_on_step_end_tensor_inputs is not None:
            unknown = [k for k in callback_on_step_end_tensor_inputs if k not in self._callback_tensor_inputs]
            if unknown:
                raise ValueError(f"`callback_on_step_end_tensor_inputs` must be among {self._callback_tensor_inputs}, "
                                 f"got unknown {unknown}")

        if prompt is not None and prompt_embeds is not None:
            raise ValueError("pass either `prompt` or `prompt_embeds`, not both")
        if prompt is None and prompt_embeds is None:
            raise ValueError("pass `prompt` (a string or a list of strings) or `prompt_embeds`")
        prompt_ok = isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) > 0
                                                and all(isinstance(p, str) for p in prompt))
        if prompt is not None and not prompt_ok:
            raise ValueError(f"`prompt` must be a string or a non-empty list of strings, got {type(prompt).__name__}")
        if negative_prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("pass either `negative_prompt` or `negative_prompt_embeds`, not both")
        if prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("`negative_prompt_embeds` goes with `prompt_embeds`; with `prompt`, pass "
                             "`negative_prompt`")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            batch = len(prompt) if isinstance(prompt, list) else 1 if prompt is not None else prompt_embeds.shape[0]
            if not (isinstance(negative_prompt, list) and all(isinstance(p, str) for p in negative_prompt)):
                raise ValueError("`negative_prompt` must be a string or a list of strings, got "
                                 f"{type(negative_prompt).__name__}")
            if len(negative_prompt) != batch:
                raise ValueError(f"`negative_prompt` has {len(negative_prompt)} entries for {batch} prompts")

        caption_channels = self.transformer.config.caption_channels
        for name, embeds, mask_name, mask in (
                ("prompt_embeds", prompt_embeds, "prompt_attention_mask", prompt_attention_mask),
                ("negative_prompt_embeds", negative_prompt_embeds, "negative_prompt_attention_mask",
                 negative_prompt_attention_mask)):
            if embeds is None:
                continue
            if mask is None:
                raise ValueError(f"`{mask_name}` is required with `{name}`")
            if embeds.dim() != 3 or embeds.shape[-1] != caption_channels:
                raise ValueError(f"`{name}` must be [batch, tokens, {caption_channels}] (the transformer's "
                                 f"caption_channels), got {tuple(embeds.shape)}")
            if tuple(mask.shape) != tuple(embeds.shape[:2]):
                raise ValueError(f"`{mask_name}` must be [batch, tokens] = {tuple(embeds.shape[:2])}, got "
                                 f"{tuple(mask.shape)}")
        if prompt_embeds is not None and negative_prompt_embeds is not None \
                and prompt_embeds.shape != negative_prompt_embeds.shape:
            raise ValueError("`prompt_embeds` and `negative_prompt_embeds` must have the same shape, got "
                             f"{tuple(prompt_embeds.shape)} and {tuple(negative_prompt_embeds.shape)}")
        if guidance_scale > 1 and prompt_embeds is not None and negative_prompt_embeds is None:
            if self.tokenizer is None or self.text_encoder is None:
                raise ValueError("guidance_scale > 1 needs `negative_prompt_embeds` and "
                                 "`negative_prompt_attention_mask` when the pipeline has no text encoder")
            if max_sequence_length != prompt_embeds.shape[1]:
                raise ValueError(f"the negative prompt would be encoded to max_sequence_length={max_sequence_length}"
                                 f" tokens but `prompt_embeds` has {prompt_embeds.shape[1]}; leave "
                                 "max_sequence_length unset or pass `negative_prompt_embeds`")

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

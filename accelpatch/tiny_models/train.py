"""Train a tiny Wan pipeline on procedural videos, on CPU, and save it as a diffusers folder.

Why: quality gates run on tiny models; random weights make noise, so a gate comparing two noise videos measures
nothing. A tiny model trained on clips with real structure (:mod:`accelpatch.tiny_models.procedural`) makes videos
whose colour and motion follow the prompt, so temporal and per-frame gates have something to see.

What: two phases, both seeded. (1) The tiny ``AutoencoderKLWan`` learns to reconstruct 5-frame 64 x 64 crops of
procedural clips (the VAE is convolutional, so crops train it for the full 128 x 256 frames at a fraction of the
cost); its latents' per-channel mean and std over the training clips go into its config (``latents_mean`` /
``latents_std``, as Wan's pipeline un-normalises them). (2) The tiny ``WanTransformer3DModel`` learns rectified
flow on the normalised latents of a fixed set of encoded clips: x_t = (1 - sigma) x0 + sigma noise, target
noise - x0, sigma drawn uniformly then shifted as the pipeline's ``FlowMatchEulerDiscreteScheduler(shift=3)`` does,
timestep = 1000 sigma, conditioned on the fixed tiny UMT5 text encoder's embedding of the clip's prompt (dropped to
the empty prompt 10% of the time, so classifier-free guidance works). A word-level tokenizer over the procedural
vocabulary replaces the test pipelines' 5-token one (which maps every prompt to one unknown token).

The result loads with ``WanPipeline.from_pretrained(folder)``; call it with :func:`wan_call_kwargs`.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from accelpatch.tiny_models import TRAINABLE_FAMILIES, procedural

#: The tiny Wan VAE's shape (the one :func:`accelpatch.testing.tiny_wan_pipeline` uses: 3 channels wide,
#: 16 latent channels, 4x temporal and 8x spatial compression; ~14k parameters).
WAN_VAE_CONFIG: dict[str, Any] = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                      temperal_downsample=[False, True, True])
#: Prompts are tokenized to at most this many tokens; the embeddings are zero-padded to it (as Wan's pipeline does),
#: so calls must pass the same ``max_sequence_length`` as training (see :func:`wan_call_kwargs`).
MAX_SEQUENCE_LENGTH = 16
#: Scheduler shift (the tiny test pipeline's ``FlowMatchEulerDiscreteScheduler(shift=3.0)``).
FLOW_SHIFT = 3.0


@dataclass(frozen=True)
class WanTrainingConfig:
    """Sizes and rates of one training run. ``steps``: transformer steps; ``videos``: clips encoded once for the
    transformer phase; crops and the latent dataset are drawn from the seed."""

    steps: int = 3000
    vae_steps: int = 600
    videos: int = 256
    batch_size: int = 2
    vae_batch_size: int = 2
    lr: float = 5e-4
    vae_lr: float = 2e-3
    kl_weight: float = 1e-6
    prompt_dropout: float = 0.1
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
    config: WanTrainingConfig
    vae_losses: list[float] = field(default_factory=list)
    transformer_losses: list[float] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    vae_check: dict[str, Any] = field(default_factory=dict)


def wan_tokenizer():
    """A word-level tokenizer over :func:`procedural.vocabulary` (lower-cased, split on whitespace and punctuation;
    unknown words -> ``<unk>``), built offline; saves as ``tokenizer.json`` and loads with ``AutoTokenizer``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1}
    for word in procedural.vocabulary():
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")


def build_wan_pipeline(seed: int = 0):
    """An untrained tiny ``WanPipeline``: the transformer of :data:`accelpatch.testing.wan.WAN_SOL_CONFIG` (2 heads x
    128, 2 layers, ~1.8M parameters), the VAE of :data:`WAN_VAE_CONFIG`, a one-layer UMT5 text encoder (width 32)
    over :func:`wan_tokenizer`'s vocabulary, all seeded; ``FlowMatchEulerDiscreteScheduler(shift=3)``."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from accelpatch.testing.wan import WAN_SOL_CONFIG

    tokenizer = wan_tokenizer()
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**WAN_SOL_CONFIG)
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(**WAN_VAE_CONFIG)
    torch.manual_seed(seed + 2)
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=int(WAN_SOL_CONFIG["text_dim"]),
                                               d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                               relative_attention_num_buckets=8))
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder.eval(), vae=vae.eval(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT), transformer=transformer.eval())


def wan_call_kwargs(prompt: str = "a red square moves left", *, num_inference_steps: int = 8,
                    guidance_scale: float = 4.0, seed: int = 0, negative_prompt: str = "",
                    output_type: str = "pt") -> dict[str, Any]:
    """Call kwargs for a trained tiny Wan pipeline at its training size: 13 frames of 128 x 256 (512 tokens per
    forward) and the training ``max_sequence_length``."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=procedural.VIDEO_HEIGHT,
                width=procedural.VIDEO_WIDTH, num_frames=procedural.VIDEO_FRAMES,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=MAX_SEQUENCE_LENGTH)


def train_family(family: str, out_dir: str | Path, *, steps: int | None = None, vae_steps: int | None = None,
                 videos: int | None = None, seed: int = 0, progress: bool = True, threads: int | None = None,
                 **overrides: Any) -> TrainResult:
    """Train ``family``'s tiny pipeline from ``seed`` and save it to ``out_dir`` (a diffusers folder plus
    ``training.json``). ``steps`` / ``vae_steps`` / ``videos`` and any :class:`WanTrainingConfig` field override
    the defaults; ``threads`` sets torch's CPU threads for the run. Same seed, same threads, same machine: same
    weights."""
    if family not in TRAINABLE_FAMILIES:
        raise ValueError(f"train-tiny: no training for {family!r} yet (trainable: {', '.join(TRAINABLE_FAMILIES)})")
    given = dict(steps=steps, vae_steps=vae_steps, videos=videos, **overrides)
    config = WanTrainingConfig(**{k: v for k, v in given.items() if v is not None})
    if min(config.steps, config.vae_steps, config.videos, config.batch_size, config.vae_batch_size) < 1:
        raise ValueError("train-tiny: steps, vae steps, videos and batch sizes must be at least 1")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train_wan(Path(out_dir), config, seed, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress, dynamic_ncols=True, leave=True)


def _train_wan(out_dir: Path, config: WanTrainingConfig, seed: int, progress: bool) -> TrainResult:
    start = time.perf_counter()
    result = TrainResult(family="wan", out_dir=out_dir, seed=seed, config=config)
    pipe = build_wan_pipeline(seed)
    pipe.set_progress_bar_config(disable=True)

    t0 = time.perf_counter()
    result.vae_losses = _train_vae(pipe.vae, config, seed, progress)
    result.phase_s["vae"] = time.perf_counter() - t0
    result.vae_check = check_vae(pipe.vae, config, seed)
    if result.vae_check["problems"]:
        warnings.warn(f"train-tiny wan: {vae_problem_text(result.vae_check)}", RuntimeWarning, stacklevel=3)

    t0 = time.perf_counter()
    latents, prompts = _encode_dataset(pipe.vae, config, seed, progress)
    embeds, empty = _prompt_embeddings(pipe, prompts)
    result.phase_s["encode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    result.transformer_losses = _train_transformer(pipe.transformer, latents, embeds, empty, config, seed, progress)
    result.phase_s["transformer"] = time.perf_counter() - t0

    pipe.transformer.eval()
    pipe.vae.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir)
    result.wall_s = time.perf_counter() - start
    _write_record(out_dir, result)
    return result


def _crop(video: torch.Tensor, clip: procedural.Clip, config: WanTrainingConfig, gen: torch.Generator):
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


def _train_vae(vae, config: WanTrainingConfig, seed: int, progress: bool) -> list[float]:
    gen = torch.Generator().manual_seed(seed * 1000 + 11)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.vae_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config.vae_steps))
    vae.train()
    losses = []
    with _bar(config.vae_steps, "wan vae", progress) as bar:
        for step in range(config.vae_steps):
            crops = []
            for j in range(config.vae_batch_size):
                video, clip = procedural.procedural_video(None, [seed, 0, step, j], frames=config.frames,
                                                          height=config.height, width=config.width)
                crops.append(_crop(video, clip, config, gen))
            x = torch.stack(crops)
            posterior = vae.encode(x).latent_dist
            z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
            recon = vae.decode(z).sample
            kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()
            loss = torch.nn.functional.mse_loss(recon, x) + 0.5 * (recon - x).abs().mean() + config.kl_weight * kl
            _descend(vae, optimizer, schedule, loss, losses, bar, last=step == config.vae_steps - 1)
    vae.eval()
    return losses


#: what a trained VAE must keep of whole clips before the transformer trains on its latents: the round trip's mean
#: squared error on the [-1, 1] range, its growth from the first frames to the last (a causal VAE trained on short
#: crops degrades on later frames), and the share of the clips' colour saturation it keeps (a too-narrow VAE washes
#: the shapes' colours out). Measured by this check on the first two full-length runs (4 clips, photos included):
#: 5-frame crops, 1,200 steps: MSE 0.26, the last frames' error 62.6x the first's; whole-clip crops, 600 steps:
#: MSE 0.16, 1.2x, but 21 % of the saturation kept. Neither passes, and neither run's videos followed their prompts.
VAE_LIMITS = {"mse": 0.05, "late_over_early": 3.0, "saturation_kept": 0.5}


@torch.no_grad()
def check_vae(vae, config: WanTrainingConfig, seed: int, clips: int = 4) -> dict[str, Any]:
    """How well ``vae`` reconstructs whole procedural clips (never a crop): mean squared error, the last quarter of
    the frames' error over the first quarter's, and the saturation (max - min channel) kept at its peak; and
    ``problems``, one line per limit of :data:`VAE_LIMITS` missed."""
    vae.eval()
    mse, late, kept = [], [], []
    for i in range(clips):
        video, _ = procedural.procedural_video(None, [seed, 7, i], frames=config.frames, height=config.height,
                                               width=config.width)
        x = video[None]
        recon = vae.decode(vae.encode(x).latent_dist.mean).sample.clamp(-1, 1)
        per_frame = (recon - x).pow(2).mean(dim=(0, 1, 3, 4))
        quarter = max(1, per_frame.numel() // 4)
        mse.append(float(per_frame.mean()))
        late.append(float(per_frame[-quarter:].mean() / per_frame[:quarter].mean().clamp_min(1e-8)))
        kept.append(_saturation(recon) / max(_saturation(x), 1e-8))
    found = {"mse": sum(mse) / clips, "late_over_early": max(late), "saturation_kept": min(kept)}
    problems = []
    if found["mse"] > VAE_LIMITS["mse"]:
        problems.append(f"round-trip MSE {found['mse']:.3f} > {VAE_LIMITS['mse']}")
    if found["late_over_early"] > VAE_LIMITS["late_over_early"]:
        problems.append(f"the last frames' error is {found['late_over_early']:.1f}x the first frames' "
                        f"(> {VAE_LIMITS['late_over_early']}: it degrades along the clip)")
    if found["saturation_kept"] < VAE_LIMITS["saturation_kept"]:
        problems.append(f"it keeps {found['saturation_kept']:.0%} of the clips' colour saturation "
                        f"(< {VAE_LIMITS['saturation_kept']:.0%}: colours wash out)")
    return {**{k: round(v, 4) for k, v in found.items()}, "problems": problems}


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
def _encode_dataset(vae, config: WanTrainingConfig, seed: int, progress: bool):
    """Encode ``config.videos`` clips (posterior means), set the VAE's ``latents_mean`` / ``latents_std`` to their
    per-channel statistics and return the normalised latents with the prompts."""
    means, prompts = [], []
    with _bar(config.videos, "wan latents", progress) as bar:
        for index in range(config.videos):
            video, clip = procedural.procedural_video(None, [seed, 1, index], frames=config.frames,
                                                      height=config.height, width=config.width)
            means.append(vae.encode(video[None]).latent_dist.mean[0])
            prompts.append(clip.prompt)
            bar.update()
    latents = torch.stack(means)
    mean = latents.mean(dim=(0, 2, 3, 4))
    std = latents.std(dim=(0, 2, 3, 4)).clamp_min(1e-4)
    vae.register_to_config(latents_mean=[float(v) for v in mean], latents_std=[float(v) for v in std])
    return (latents - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1), prompts


@torch.no_grad()
def _prompt_embeddings(pipe, prompts: list[str]):
    """Each prompt's embedding exactly as the pipeline computes it at call time, and the empty prompt's."""
    unique = sorted(set(prompts)) + [""]
    embeds, _ = pipe.encode_prompt(unique, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                   device=torch.device("cpu"))
    table = dict(zip(unique, embeds))
    return torch.stack([table[p] for p in prompts]), table[""]


def _train_transformer(transformer, latents, embeds, empty, config: WanTrainingConfig, seed: int,
                       progress: bool) -> list[float]:
    gen = torch.Generator().manual_seed(seed * 1000 + 23)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=config.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config.steps))
    transformer.train()
    losses = []
    batch = config.batch_size
    with _bar(config.steps, "wan transformer", progress) as bar:
        for step in range(config.steps):
            index = torch.randint(len(latents), (batch,), generator=gen)
            x0, text = latents[index], embeds[index].clone()
            text[torch.rand(batch, generator=gen) < config.prompt_dropout] = empty
            u = torch.rand(batch, generator=gen)
            sigma = FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)
            noise = torch.randn(x0.shape, generator=gen)
            s = sigma.view(-1, 1, 1, 1, 1)
            xt = (1 - s) * x0 + s * noise
            prediction = transformer(hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=text,
                                     return_dict=False)[0]
            loss = torch.nn.functional.mse_loss(prediction, noise - x0)
            _descend(transformer, optimizer, schedule, loss, losses, bar, last=step == config.steps - 1)
    transformer.eval()
    return losses


def _write_record(out_dir: Path, result: TrainResult) -> None:
    """``training.json``: how the folder was made (command inputs, versions, loss summary, times)."""
    import diffusers
    import transformers

    def summary(losses: list[float]) -> dict[str, float]:
        head, tail = losses[:50], losses[-50:]
        return dict(first_50_mean=sum(head) / len(head), last_50_mean=sum(tail) / len(tail), steps=len(losses))

    record = dict(family=result.family, seed=result.seed, config=asdict(result.config),
                  vae_loss=summary(result.vae_losses), transformer_loss=summary(result.transformer_losses),
                  vae_check=result.vae_check,
                  phase_s={k: round(v, 1) for k, v in result.phase_s.items()}, wall_s=round(result.wall_s, 1),
                  threads=torch.get_num_threads(), versions=dict(torch=torch.__version__,
                                                                 diffusers=diffusers.__version__,
                                                                 transformers=transformers.__version__),
                  call=dict(height=procedural.VIDEO_HEIGHT, width=procedural.VIDEO_WIDTH,
                            num_frames=procedural.VIDEO_FRAMES, max_sequence_length=MAX_SEQUENCE_LENGTH))
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def training_losses(folder: str | Path) -> dict[str, Any]:
    """The ``training.json`` record a run wrote into ``folder``."""
    return json.loads((Path(folder) / "training.json").read_text())


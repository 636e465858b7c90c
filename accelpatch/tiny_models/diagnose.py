"""Where a trained tiny transformer loses a prompt's motion: readings of single predictions, a minute for all three.

What a pipeline generates (:mod:`~accelpatch.tiny_models.detect`) says *that* a family draws the colour but not the
direction; these readings say *where*, and read a training probe in a minute rather than in a generation sweep
(docs/tiny-models.md, SANA-Video 2.0's "Why it draws no direction"):

* :func:`frame_order_error`: whether the transformer knows which frame a token is in. From pure noise, reversing the
  input's frames should not simply reverse the prediction when the model places a move in time.
* :func:`prompt_effect`: how far one changed prompt word moves the prediction from pure noise (where sampling
  starts), e.g. "left" against "right", next to "red" against "blue".
* :func:`first_frame_offset`: whether the VAE's latents themselves say where a clip starts (a transformer with
  relative positions only learned the frame index from that cue, and not without it).
* :func:`one_step_directions`: clips of a move, noised to sigma, one prediction, the x0 estimate decoded and read:
  does the model keep a move it is shown, and start one from noise?

Every reading uses the family's training inputs (:func:`~accelpatch.tiny_models.train.training_settings`: the text
table and latent inputs its trainer uses, timesteps ``1000 * sigma``), no guidance unless asked, in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from accelpatch.models.families import resolve
from accelpatch.tiny_models import procedural, train
from accelpatch.tiny_models.detect import read_shape_video

#: The 8 clips :func:`one_step_directions` reads: red and blue squares, each direction.
MOVES: tuple[tuple[str, str], ...] = tuple((f"a {colour} square moves {way}", way)
                                           for colour in ("red", "blue") for way in ("left", "right", "up", "down"))


@dataclass(frozen=True)
class OneStepRead:
    """One sigma of :func:`one_step_directions`: of ``clips`` x0 estimates, how many move the prompt's way and how
    many move at all (the reader's threshold), with the prompt alone (``guidance`` None) or at that guidance."""

    sigma: float
    guidance: float | None
    right: int
    moving: int
    clips: int


class _Predictor:
    """The family's transformer called as its trainer calls it (text table rows, latent inputs, ``1000 * sigma``)."""

    def __init__(self, pipe, family: str, prompts: list[str]):
        recipe = train.training_settings(family)
        self.transformer = pipe.transformer.eval()
        self.table, self.rows = train._text_table(pipe, prompts, recipe)
        self.inputs = train._latent_inputs if recipe.model_inputs is None else resolve(recipe.model_inputs)

    def __call__(self, latents: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        text = {name: values[rows] for name, values in self.table.items()}
        timestep = torch.full((len(latents),), 1000.0 * sigma)
        return self.transformer(**self.inputs(latents), timestep=timestep, return_dict=False, **text)[0]

    def empty_rows(self, count: int) -> torch.Tensor:
        return torch.full((count,), len(next(iter(self.table.values()))) - 1)


def _statistics(vae) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~accelpatch.tiny_models.train.latent_statistics` shaped to broadcast over [B, C, F, H, W] latents."""
    return tuple(s.view(1, -1, 1, 1, 1) for s in train.latent_statistics(vae))


def _clip_latents(vae, prompts: list[str], seed: int) -> torch.Tensor:
    """The normalised posterior-mean latents of each prompt's procedural clip (clip seed ``[k, seed]``)."""
    mean, std = _statistics(vae)
    clips = [procedural.procedural_video(prompt, [k, seed])[0][None] for k, prompt in enumerate(prompts)]
    return torch.cat([(vae.encode(clip).latent_dist.mean - mean) / std for clip in clips])


def _noise_like(pipe, prompt: str, seed: int) -> torch.Tensor:
    """Pure noise of one clip's latent shape, from a generator seeded ``seed``."""
    shape = _clip_latents(pipe.vae.eval(), [prompt], 0).shape
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def frame_order_error(pipe, family: str, prompt: str = "a red square moves left", seed: int = 5) -> float:
    """``|f(R x) - R f(x)| / |f(x) - its mean|`` at sigma 1, ``R`` reversing the frames of noise ``x``: 0 when the
    transformer cannot tell frames apart (a move cannot then be started from noise), about 1 when it places its
    prediction in time. Random weights read about 0 (RoPE sees relative positions only)."""
    predict = _Predictor(pipe, family, [prompt])
    x = _noise_like(pipe, prompt, seed)
    y = predict(x, 1.0, predict.rows)
    reversed_y = predict(x.flip(2), 1.0, predict.rows)
    return float((reversed_y - y.flip(2)).norm() / (y - y.mean(dim=(2, 3, 4), keepdim=True)).norm())


@torch.no_grad()
def prompt_effect(pipe, family: str, prompt: str, other: str, seed: int = 5) -> float:
    """The norm of the difference between the predictions for ``prompt`` and ``other`` from the same pure noise
    (sigma 1): how much the words that differ steer the first step."""
    predict = _Predictor(pipe, family, [prompt, other])
    x = _noise_like(pipe, prompt, seed).expand(2, -1, -1, -1, -1)
    v = predict(x, 1.0, predict.rows)
    return float((v[0] - v[1]).norm())


@torch.no_grad()
def first_frame_offset(vae, seed: int = 3) -> float:
    """How far the first latent frame sits from the others in :data:`MOVES`' clips (clip seed ``[k, seed]``): the
    per-channel mean over the clips of :func:`~accelpatch.tiny_models.train.first_frame_offsets`, its size averaged
    over the channels, in channel stds. Wan's causal VAE reads about 1.4, the LTX-2 VAE about 0.01 unless trained
    with :attr:`~accelpatch.tiny_models.train.TrainingConfig.vae_frame_cue`."""
    latents = _clip_latents(vae.eval(), [prompt for prompt, _ in MOVES], seed)
    return float(train.first_frame_offsets(latents).mean(0).abs().mean())


@torch.no_grad()
def one_step_directions(pipe, family: str, sigmas=(0.6, 0.9, 1.0), guidance: float | None = None,
                        seed: int = 9) -> list[OneStepRead]:
    """For each sigma: :data:`MOVES`' clips (clip seed ``[k, seed]``) noised to sigma with one noise draw, one
    prediction each (``guidance``: classifier-free against the empty prompt), the x0 estimate decoded and read
    with :func:`~accelpatch.tiny_models.detect.read_shape_video`."""
    prompts = [prompt for prompt, _ in MOVES]
    vae = pipe.vae.eval()
    mean, std = _statistics(vae)
    predict = _Predictor(pipe, family, prompts)
    x0 = _clip_latents(vae, prompts, seed)
    reads = []
    for sigma in sigmas:
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(5))
        xt = (1 - sigma) * x0 + sigma * noise
        v = predict(xt, sigma, predict.rows)
        if guidance is not None:
            v_empty = predict(xt, sigma, predict.empty_rows(len(prompts)))
            v = v_empty + guidance * (v - v_empty)
        video = vae.decode((xt - sigma * v) * std + mean).sample.clamp(-1, 1)
        found = [read_shape_video(clip).direction for clip in video]
        reads.append(OneStepRead(sigma, guidance, sum(got == way for got, (_, way) in zip(found, MOVES)),
                                 sum(got is not None for got in found), len(MOVES)))
    return reads

"""SANA-Video 2.0's input embeddings, as the release builds them: the timestep (:class:`TimestepEmbedder`), the
caption (:class:`CaptionEmbedder`), the latent patches (:class:`PatchEmbed3D`) and the 3-D RoPE tables
(:class:`WanRope3D`). Parameter names mirror the original checkpoint keys.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from torch import nn

__all__ = ["TimestepEmbedder", "CaptionEmbedder", "PatchEmbed3D", "WanRope3D"]


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding (256 dims, cos first, max period 10^4) and a SiLU MLP, as PixArt/Sana."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    @staticmethod
    def sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``dtype``: the model's compute dtype. Not the weight's: under layerwise casting that is the storage dtype
        (float8), and the weights are upcast only inside each Linear (diffusers passes the hidden dtype alike)."""
        return self.mlp(self.sinusoid(t, self.frequency_embedding_size).to(dtype))


class CaptionEmbedder(nn.Module):
    """Caption projection ``fc2(GELU_tanh(fc1(y)))``; ``y_embedding`` is the null caption that replaces a caption
    with probability ``class_dropout_prob`` in training (classifier-free guidance dropout), unused in eval mode."""

    def __init__(self, caption_channels: int, hidden_size: int, model_max_length: int,
                 class_dropout_prob: float) -> None:
        super().__init__()
        self.class_dropout_prob = class_dropout_prob
        self.y_proj = nn.Module()
        self.y_proj.fc1 = nn.Linear(caption_channels, hidden_size)
        self.y_proj.fc2 = nn.Linear(hidden_size, hidden_size)
        self.register_buffer("y_embedding", torch.randn(model_max_length, caption_channels) / caption_channels ** 0.5)

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        if self.training and self.class_dropout_prob > 0:
            drop = torch.rand(caption.shape[0], device=caption.device) < self.class_dropout_prob
            null = self.y_embedding[: caption.shape[1]].to(caption.dtype)
            caption = torch.where(drop[:, None, None], null[None], caption)
        return self.y_proj.fc2(F.gelu(self.y_proj.fc1(caption), approximate="tanh"))


class PatchEmbed3D(nn.Module):
    """Conv3d with kernel = stride = patch, flattened to tokens in (frame, height, width) raster order."""

    def __init__(self, in_channels: int, hidden_size: int, patch_size: Sequence[int]) -> None:
        super().__init__()
        self.proj = nn.Conv3d(in_channels, hidden_size, kernel_size=tuple(patch_size), stride=tuple(patch_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class WanRope3D:
    """Wan 3-D RoPE tables for one head dim (complex128, positions 0..max_len-1 per axis); the t/h/w split is
    ``d - 4·(d//6)`` / ``2·(d//6)`` / ``2·(d//6)`` channels (128: 44/42/42; 256: 88/84/84). Not a buffer: the
    tables are a function of the config and never travel in a state dict. They are built with the object (on the
    CPU, also when the model is built on the meta device; a few MB), never on first use: a table made inside a
    compiled call would change the object that the compiled code guards on, and the next call would recompile."""

    def __init__(self, head_dim: int, max_len: int = 1024, theta: float = 10000.0) -> None:
        self.head_dim = head_dim
        self.max_len = max_len
        self.theta = theta
        side = 2 * (head_dim // 6)
        self.axis_dims = (head_dim - 2 * side, side, side)
        self._tables = self._axis_tables()

    def _axis_tables(self) -> list[torch.Tensor]:
        with torch.device("cpu"):  # not the meta device of a model being built for loading
            return [get_1d_rotary_pos_embed(dim, self.max_len, self.theta, use_real=False, freqs_dtype=torch.float64)
                    for dim in self.axis_dims]

    def __call__(self, frames: int, height: int, width: int, device: torch.device) -> torch.Tensor:
        """[N, head_dim/2] complex frequencies for tokens in (f, h, w) raster order."""
        if max(frames, height, width) > self.max_len:
            raise ValueError(f"latent grid {frames}x{height}x{width} exceeds the RoPE table ({self.max_len} per axis)")
        t, h, w = (tab.to(device) for tab in self._tables)
        grid = (frames, height, width)
        parts = [t[:frames].view(frames, 1, 1, -1), h[:height].view(1, height, 1, -1),
                 w[:width].view(1, 1, width, -1)]
        return torch.cat([p.expand(*grid, p.shape[-1]) for p in parts], dim=-1).reshape(frames * height * width, -1)

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "_tables"}  # rebuilt, not pickled

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._tables = self._axis_tables()


"""``SanaVideo2Transformer3DModel``: SANA-Video 2.0 as a diffusers model (diffusers has no class for it).

Architecture and numerics follow the release (NVlabs/Sana ``sana_video2.py`` / ``sana_video2_blocks.py``): hybrid
attention (gated linear attention everywhere except the softmax "anchor" layers, which follow a fixed rule), text
cross-attention in every layer, SwiGLU MLPs, AdaLN-style modulation from the timestep, and Block Attention
Residuals in place of a plain residual stream. Parameter and buffer names mirror the original checkpoint keys, so loading an original state dict
is rename-free. Config field names are the original constructor's; the defaults are the 5B release, and
``SanaVideo2Transformer3DModel(hidden_size=4096, depth=40, num_heads=32)`` is the 14B one.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.loaders import PeftAdapterMixin
from diffusers.models.attention import AttentionMixin
from diffusers.models.cache_utils import CacheMixin
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from accelpatch.parallel.sequence import SequenceShards, model_split, split_in_one_process
from accelpatch.models.sana_video2.release import anchor_layer_indices
from accelpatch.models.sana_video2.modeling.attention import (RMSNorm, SanaVideo2CrossAttention, SanaVideo2LinearAttention, SanaVideo2LinearAttnProcessor,
                        SanaVideo2SoftmaxAttention)
from accelpatch.models.sana_video2.modeling.sequence_parallel import CP_PLAN, check_parallel_config, check_split, inference_only_error, local_frames

SOFTMAX, LINEAR = "softmax", "linear"


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def _per_frame(x: torch.Tensor, table_rows: torch.Tensor, frames: Optional[int]) -> torch.Tensor:
    """Apply one modulation row ``table_rows`` ([B, 1, C], or [B, F, 1, C] per frame) to tokens ``x`` [B, N, C]."""
    if frames is None:
        return x * table_rows
    batch, tokens, width = x.shape
    return (x.reshape(batch, frames, tokens // frames, width) * table_rows).reshape(batch, tokens, width)


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


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden)
        self.up_proj = nn.Linear(width, hidden)
        self.down_proj = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SanaVideo2Block(nn.Module):
    """One layer: the attention sub-layer (modulated self-attention, gated, then cross-attention on h + a; returns
    a + c) and the MLP sub-layer (modulated, gated SwiGLU). Each returns its delta: the residual stream is the
    model's Attention Residuals, not an addition here."""

    def __init__(self, hidden_size: int, num_heads: int, attention_type: str, *, linear_head_dim: int,
                 softmax_head_dim: int, mlp_ratio: float, qk_norm: bool, cross_norm: bool, norm_eps: float,
                 fp32_attention: bool) -> None:
        super().__init__()
        self.attention_type = attention_type
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        attention_cls, head_dim = ((SanaVideo2SoftmaxAttention, softmax_head_dim) if attention_type == SOFTMAX
                                   else (SanaVideo2LinearAttention, linear_head_dim))
        self.attn = attention_cls(hidden_size, head_dim, qk_norm=qk_norm, norm_eps=norm_eps,
                                  fp32_attention=fp32_attention)
        self.cross_attn = SanaVideo2CrossAttention(hidden_size, num_heads, qk_norm=cross_norm)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = SwiGLU(hidden_size, int(hidden_size * mlp_ratio))
        self.scale_shift_table = nn.Parameter(torch.randn(6, hidden_size) / hidden_size ** 0.5)

    def _modulation(self, timestep_emb: torch.Tensor) -> tuple[Optional[int], tuple[torch.Tensor, ...]]:
        """(frames or None, the six rows shift/scale/gate × msa/mlp) from t0 [B, 6C] or [B, 1, F, 6C]."""
        batch, width = timestep_emb.shape[0], self.scale_shift_table.shape[1]
        if timestep_emb.dim() == 2:
            return None, (self.scale_shift_table[None] + timestep_emb.reshape(batch, 6, width)).chunk(6, dim=1)
        frames = timestep_emb.shape[2]
        rows = self.scale_shift_table[None, None] + timestep_emb.reshape(batch, frames, 6, width)
        return frames, rows.chunk(6, dim=2)

    def _modulated(self, norm: nn.Module, x: torch.Tensor, shift, scale, frames: Optional[int]) -> torch.Tensor:
        if frames is None:
            return modulate(norm(x), shift, scale)
        batch, tokens, width = x.shape
        grouped = norm(x).reshape(batch, frames, tokens // frames, width)
        return modulate(grouped, shift, scale).reshape(batch, tokens, width)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep_emb: torch.Tensor,
                encoder_attention_mask: Optional[torch.Tensor], rotary_emb: Optional[torch.Tensor],
                sublayer: str) -> torch.Tensor:
        """The delta of one sub-layer (``sublayer`` is "attention" or "mlp") for its mixed input."""
        frames, (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp) = self._modulation(timestep_emb)
        if sublayer == "attention":
            attn_in = self._modulated(self.norm1, hidden_states, shift_msa, scale_msa, frames)
            attn_delta = _per_frame(self.attn(attn_in, rotary_emb), gate_msa, frames)
            cross_delta = self.cross_attn(hidden_states + attn_delta, encoder_hidden_states, encoder_attention_mask)
            return attn_delta + cross_delta
        if sublayer == "mlp":
            mlp_in = self._modulated(self.norm2, hidden_states, shift_mlp, scale_mlp, frames)
            return _per_frame(self.mlp(mlp_in), gate_mlp, frames)
        raise ValueError(f"sublayer must be 'attention' or 'mlp', got {sublayer!r}")


def _plain_linear(layer: nn.Module) -> bool:
    """Whether calling ``layer`` is exactly ``F.linear`` over its plain tensor weight: torch's own ``nn.Linear``,
    weight and bias plain tensors (not a quantized tensor subclass), no hooks and no instance ``forward``."""
    return (type(layer) is nn.Linear and type(layer.weight) in (torch.Tensor, nn.Parameter)
            and (layer.bias is None or type(layer.bias) in (torch.Tensor, nn.Parameter))
            and not (layer._forward_pre_hooks or layer._forward_hooks or "forward" in layer.__dict__))


class BlockAttentionResidual(nn.Module):
    """Attention Residuals over depth: each sub-layer's input is a softmax mix, per token, of the sources so far
    (the embedded input, each finished group's summed deltas, the current group's partial sum), keyed by a
    parameter-free RMSNorm (eps 1e-6, activation dtype) and scored by a learned vector (``attn_proj``, ``mlp_proj``,
    ``final_proj``; zero-initialised, so an untrained mix is the plain mean). One source passes through."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.attn_proj = nn.Linear(hidden_size, 1, bias=False)
        self.mlp_proj = nn.Linear(hidden_size, 1, bias=False)
        self.final_proj = nn.Linear(hidden_size, 1, bias=False)
        for proj in (self.attn_proj, self.mlp_proj, self.final_proj):
            nn.init.zeros_(proj.weight)

    @staticmethod
    def key(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)

    @staticmethod
    def mix(projection: nn.Linear, values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Mix ``values`` [n, B, N, C] with their ``keys``; n = 1 passes the only source through."""
        if values.shape[0] == 1:
            return values[0]
        return torch.einsum("nbt,nbtd->btd", F.softmax(BlockAttentionResidual.logits(projection, keys), dim=0),
                            values)

    @staticmethod
    def logits(projection: nn.Linear, keys: torch.Tensor) -> torch.Tensor:
        """The score ``w · key`` [n, B, N] of each source and token. A plain ``nn.Linear`` (a plain tensor weight, no
        hooks) is read as one einsum over its weight row, the model's numbers since its first release; any other
        layer is called, as diffusers calls its layers: a quantized weight (torchao's tensor subclasses, GGUF) runs
        its own kernels, a layer class of its own (optimum-quanto, PEFT) its own forward, and hooks (offloading,
        layerwise casting) get to move or cast the weight first."""
        if _plain_linear(projection):
            return torch.einsum("d,nbtd->nbt", projection.weight[0], keys)
        return projection(keys).squeeze(-1)


class _Sources:
    """The residual sources of one forward. Without autograd they live in preallocated buffers (the release's
    inference layout); with it they are stacked per mix, since writing into a buffer would invalidate tensors
    autograd saved. Both give the same numbers."""

    def __init__(self, x: torch.Tensor, capacity: int) -> None:
        self._buffered = not torch.is_grad_enabled()
        if self._buffered:
            self.values = x.new_empty((capacity,) + x.shape)
            self.keys = torch.empty_like(self.values)
        else:
            self.values, self.keys = [], []
        self.count = 0
        self.append(x)

    def append(self, x: torch.Tensor) -> None:
        if self._buffered:
            self.values[self.count] = x
            self.keys[self.count] = BlockAttentionResidual.key(x)
        else:
            self.values.append(x)
            self.keys.append(BlockAttentionResidual.key(x))
        self.count += 1

    def mix(self, projection: nn.Linear, partial: Optional[torch.Tensor]) -> torch.Tensor:
        n = self.count + (partial is not None)
        if self._buffered:
            if partial is not None:
                self.values[self.count] = partial
                self.keys[self.count] = BlockAttentionResidual.key(partial)
            return BlockAttentionResidual.mix(projection, self.values[:n], self.keys[:n])
        values, keys = list(self.values), list(self.keys)
        if partial is not None:
            values.append(partial)
            keys.append(BlockAttentionResidual.key(partial))
        return BlockAttentionResidual.mix(projection, torch.stack(values), torch.stack(keys))


class FinalLayer(nn.Module):
    """LayerNorm (no affine), shift/scale from ``t`` (not t0) and a linear map back to latent channels."""

    def __init__(self, hidden_size: int, patch_elements: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_elements * out_channels)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden_size) / hidden_size ** 0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 2:
            shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
            return self.linear(modulate(self.norm_final(x), shift, scale))
        batch, tokens, width = x.shape
        frames = t.shape[2]
        shift, scale = (self.scale_shift_table[None, None] + t.transpose(1, 2)).chunk(2, dim=2)
        x = modulate(self.norm_final(x).reshape(batch, frames, tokens // frames, width), shift, scale)
        return self.linear(x.reshape(batch, tokens, width))


class SanaVideo2Transformer3DModel(ModelMixin, ConfigMixin, AttentionMixin, CacheMixin, PeftAdapterMixin):
    r"""SANA-Video 2.0 transformer (diffusers format).

    ``forward(hidden_states [B, C, F, H, W], encoder_hidden_states [B, L, caption_channels] (or [B, 1, L, ...]),
    timestep [B] on the 0-1000 scale (or per frame: [B, F], [B, 1, F] or [B, 1, F, 1, 1], for image-to-video),
    encoder_attention_mask [B, L] (1 = keep) optional)`` returns the flow velocity in ``.sample``, shaped like the
    input. With ``timestep_norm_scale_factor == 1`` timesteps are truncated to integers before the embedding, as in
    the release; otherwise they are divided by the factor.

    Layers listed in :attr:`softmax_layer_indices` use :class:`SanaVideo2SoftmaxAttention`, the others
    :class:`SanaVideo2LinearAttention`; ``fp32_attention`` (True in every release config) runs both attention cores
    in FP32. ``input_size`` only sizes the ``pos_embed`` buffer the release keeps, unused, for checkpoint
    compatibility; ``class_dropout_prob`` is the caption dropout applied in training mode.

    Several processes (inference): ``model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=N))``
    splits the tokens over N ranks by :attr:`_cp_plan` (:mod:`.sequence_parallel`); every rank returns the whole
    output. Any Ulysses degree runs: where it does not divide the anchor heads (5B: 10 heads on 4 or 8 ranks) they
    are padded with zero heads (12 or 16: that much more anchor compute); ring degrees are refused for FP32 anchors;
    the latent tokens must divide by N, and with per-frame timesteps the latent frames.
    """

    #: diffusers' context-parallel plan (:mod:`.sequence_parallel`): ``model.enable_parallelism(config=
    #: ContextParallelConfig(ulysses_degree=N))`` splits the tokens over N ranks
    _cp_plan = CP_PLAN
    #: the one-process split of :meth:`enable_sequence_shards`; None: diffusers' config, if any
    _sequence_shards: Optional[SequenceShards] = None

    #: a step cache's hook point (accelpatch.step_cache.cache): after the first block, ``reuse(delta)`` may return the
    #: remaining blocks' cached contribution, skipping them; ``store(tail)`` keeps it. None: every block runs.
    _remaining_blocks_cache = None

    _supports_gradient_checkpointing = True
    _no_split_modules = ["SanaVideo2Block"]
    _repeated_blocks = ["SanaVideo2Block"]
    #: kept in the compute dtype by ``enable_layerwise_casting``: the patch embedding and norms (diffusers' usual
    #: choice), and the Attention Residual scores, whose three tiny weight rows are read directly where nothing
    #: hooks their Linear (BlockAttentionResidual.logits): casting them would also move the model's numbers
    _skip_layerwise_casting_patterns = ["x_embedder", "norm", "attn_res"]

    @register_to_config
    def __init__(
        self,
        in_channels: int = 128,
        hidden_size: int = 2560,
        depth: int = 32,
        num_heads: int = 20,
        linear_head_dim: int = 128,
        softmax_head_dim: int = 256,
        softmax_ratio: float = 0.25,
        mlp_ratio: float = 4.0,
        caption_channels: int = 2304,
        model_max_length: int = 300,
        attn_res_block_size: int = 8,
        patch_size: Union[int, Sequence[int]] = (1, 1, 1),
        qk_norm: bool = True,
        cross_norm: bool = True,
        y_norm: bool = True,
        y_norm_scale_factor: float = 0.01,
        norm_eps: float = 1e-5,
        timestep_norm_scale_factor: float = 1.0,
        fp32_attention: bool = True,
        pred_sigma: bool = False,
        class_dropout_prob: float = 0.1,
        input_size: int = 15,
        rope_max_seq_len: int = 1024,
    ) -> None:
        super().__init__()
        patch = (patch_size,) * 3 if isinstance(patch_size, int) else tuple(patch_size)
        if len(patch) != 3 or patch[0] != 1:
            raise ValueError(f"patch_size must be a 3-tuple (1, ph, pw), got {patch_size!r}")
        for name, head_dim in (("linear_head_dim", linear_head_dim), ("softmax_head_dim", softmax_head_dim),
                               ("num_heads", num_heads)):
            if head_dim < 1 or hidden_size % head_dim:
                raise ValueError(f"hidden_size={hidden_size} must be divisible by {name}={head_dim}")
        if attn_res_block_size < 1:
            raise ValueError(f"attn_res_block_size must be >= 1, got {attn_res_block_size}")
        out_channels = in_channels * (2 if pred_sigma else 1)
        self.patch = patch
        #: the softmax "anchor" layers (release rule); every other layer uses gated linear attention
        self.softmax_layer_indices = anchor_layer_indices(depth, softmax_ratio)
        self.block_attention_types = [SOFTMAX if i in self.softmax_layer_indices else LINEAR for i in range(depth)]

        self.register_buffer("pos_embed", torch.zeros(1, input_size * input_size, hidden_size))
        self.x_embedder = PatchEmbed3D(in_channels, hidden_size, patch)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        self.y_embedder = CaptionEmbedder(caption_channels, hidden_size, model_max_length, class_dropout_prob)
        self.attention_y_norm = (RMSNorm(hidden_size, eps=norm_eps, scale_factor=y_norm_scale_factor) if y_norm
                                 else nn.Identity())
        self.blocks = nn.ModuleList(
            SanaVideo2Block(hidden_size, num_heads, kind, linear_head_dim=linear_head_dim,
                            softmax_head_dim=softmax_head_dim, mlp_ratio=mlp_ratio, qk_norm=qk_norm,
                            cross_norm=cross_norm, norm_eps=norm_eps, fp32_attention=fp32_attention)
            for kind in self.block_attention_types)
        self.attn_res = BlockAttentionResidual(hidden_size)
        self.final_layer = FinalLayer(hidden_size, math.prod(patch), out_channels)
        self.rope_linear = WanRope3D(linear_head_dim, rope_max_seq_len)
        self.rope_softmax = WanRope3D(softmax_head_dim, rope_max_seq_len)
        self.gradient_checkpointing = False

    @classmethod
    def from_original_checkpoint(cls, path_or_state_dict, config=None, torch_dtype=None):
        """Load a released SANA-Video 2.0 checkpoint in the original NVlabs/Sana format.

        ``path_or_state_dict``: a ``.pth`` / ``.pt`` / ``.bin`` torch pickle (opened only with
        ``weights_only=True`` and memory-mapped), a ``.safetensors`` file, or a state dict. The weights may be under
        ``generator``, ``state_dict`` or ``state_dict_ema``, and keys may carry a ``module.`` or ``model.`` prefix.
        ``config``: None (inferred from the shapes; the cross-attention heads are taken as ``hidden_size // 128``),
        a dict of constructor kwargs, or the release ``config.yaml``. ``torch_dtype`` casts the weights (default:
        the checkpoint's dtype).

        Every key and shape is validated before anything is assigned. A mismatch raises a ``ValueError`` that
        names the keys. The only exceptions are the two unused buffers: ``pos_embed`` (may be absent or of any
        ``[1, S², C]`` shape; the model keeps zeros) and ``y_embedder.y_embedding`` (may be absent). Returns the
        model in eval mode; it owns its weights (read tensor by tensor into fresh memory, never views of the file, so
        the file may change or go away afterwards). See
        :mod:`accelpatch.models.sana_video2.modeling.convert`, which also writes diffusers folders
        (``convert_sana_video2``).
        """
        from accelpatch.models.sana_video2.modeling.checkpoint import load_checkpoint

        return load_checkpoint(path_or_state_dict, config, torch_dtype, progress=True, model_cls=cls, own_memory=True)

    # -- diffusers' caches -------------------------------------------------------------------------------------

    def enable_cache(self, config) -> None:
        """diffusers' ``CacheMixin.enable_cache``, refusing the caches that cannot be right on this model.

        diffusers' block caches (``FirstBlockCacheConfig``, ``MagCacheConfig``, ``SeaCacheConfig``) hook the blocks
        and assume each maps the hidden states to the next hidden states. A SANA-Video 2.0 block instead returns the
        delta of one sub-layer (it runs twice per layer), and Block Attention Residuals mix those deltas across
        depth: the head hook would take the attention delta as the first block's output and reuse tails that do
        not exist yet (measured: a ``TypeError`` at the first reuse). ``TextKVCacheConfig`` hooks NucleusMoE blocks
        only and would cache nothing here. accelpatch's step cache runs the first-block decision at the model's own
        hook point instead (``accelpatch.apply(pipe, cache="first_block")``). Other configs go to diffusers."""
        from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, SeaCacheConfig, TextKVCacheConfig

        if isinstance(config, (FirstBlockCacheConfig, MagCacheConfig, SeaCacheConfig)):
            raise ValueError(
                f"{type(config).__name__} cannot run on {type(self).__name__}: diffusers' block caches assume that "
                "each transformer block maps the hidden states to the next ones, but SANA-Video 2.0's blocks "
                "return per-sub-layer deltas that Block Attention Residuals mix across depth, so the cached "
                "residual would be wrong. Use accelpatch's step cache, which decides after the first layer at the "
                "model's own hook point: accelpatch.apply(pipe, cache='first_block') (or cache="
                "FirstBlockCacheConfig(threshold=...); a 'high'-tier fast path, with the guards cache_warmup_steps, "
                "cache_max_reuse and cache_final_steps).")
        if isinstance(config, TextKVCacheConfig):
            raise ValueError(f"TextKVCacheConfig caches the text K/V of NucleusMoE image blocks only; "
                             f"{type(self).__name__} has none, so it would cache nothing")
        super().enable_cache(config)

    # -- sequence parallelism -----------------------------------------------------------------------------------

    def enable_parallelism(self, *, config, cp_plan=None):
        """diffusers' ``enable_parallelism``, after refusing the context-parallel configs the anchors cannot run
        under (ring degree > 1 with FP32 anchors), so that a refused call leaves the model untouched. The plan is :attr:`_cp_plan`; the linear attention's processors
        take the config too (their ``_parallel_config``) and sum their token statistics over the group."""
        check_parallel_config(self, config)
        return super().enable_parallelism(config=config, cp_plan=cp_plan)

    def enable_sequence_shards(self, shards: SequenceShards) -> None:
        """Split over a group of one process (``accelpatch.parallel.sequence.shards_of_group()``), where diffusers'
        ``ContextParallelConfig`` refuses a degree of 1: the linear attention sums its statistics through the group's
        all-reduce and the split's checks and frame selection run (:func:`~accelpatch.parallel.sequence.
        split_in_one_process`, shared with SANA-Video). More ranks go through :meth:`enable_parallelism`."""
        split_in_one_process(self, shards, SanaVideo2LinearAttnProcessor)

    def sequence_split(self) -> Optional[SequenceShards]:
        """Where this process sits in the sequence split (None: unsplit)."""
        return model_split(self)

    # -- inputs -------------------------------------------------------------------------------------------------

    def _timesteps(self, timestep: Any, batch: int, frames: int, device) -> torch.Tensor:
        """[B] or, per frame, [B, 1, F] on the model's timestep scale."""
        t = torch.as_tensor(timestep, device=device)
        if t.dim() == 0:
            t = t.expand(batch)
        if t.dim() == 5 and t.shape[1] == 1 and t.shape[3:] == (1, 1):
            t = t.reshape(batch, 1, t.shape[2])
        elif t.dim() == 2:
            t = t[:, None]
        if not (t.shape == (batch,) or t.shape == (batch, 1, frames)):
            raise ValueError(f"timestep must be [B], or per frame [B, F], [B, 1, F] or [B, 1, F, 1, 1] with B={batch}, "
                             f"F={frames}; got shape {tuple(t.shape)}")
        factor = self.config.timestep_norm_scale_factor
        return t.long().float() if factor == 1.0 else t.float() / factor

    def _caption(self, encoder_hidden_states: torch.Tensor, mask: Optional[torch.Tensor], dtype: torch.dtype):
        y = encoder_hidden_states
        if y.dim() == 4 and y.shape[1] == 1:
            y = y[:, 0]
        if y.dim() != 3 or y.shape[-1] != self.config.caption_channels:
            raise ValueError(f"encoder_hidden_states must be [B, L, {self.config.caption_channels}] (or [B, 1, L, "
                             f"{self.config.caption_channels}]), got shape {tuple(encoder_hidden_states.shape)}")
        if mask is not None:
            mask = mask.reshape(mask.shape[0], -1)
            if mask.shape != y.shape[:2]:
                raise ValueError(f"encoder_attention_mask must be [B, L] = {tuple(y.shape[:2])}, got "
                                 f"{tuple(mask.shape)}")
        y = self.attention_y_norm(self.y_embedder(y.to(dtype)))
        return y, mask

    # -- forward ------------------------------------------------------------------------------------------------

    def _sublayer(self, block: SanaVideo2Block, *args) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            return self._gradient_checkpointing_func(block, *args)
        return block(*args)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_attention_mask: Optional[torch.Tensor] = None,
        attention_kwargs: Optional[dict[str, Any]] = None,
        return_dict: bool = True,
    ):
        if hidden_states.dim() != 5 or hidden_states.shape[1] != self.config.in_channels:
            raise ValueError(f"hidden_states must be [B, {self.config.in_channels}, F, H, W], got shape "
                             f"{tuple(hidden_states.shape)}")
        batch, _, frames, height, width = hidden_states.shape
        pt, ph, pw = self.patch
        if height % ph or width % pw:
            raise ValueError(f"latent height/width {height}x{width} must be multiples of the patch {self.patch}")
        grid = (frames // pt, height // ph, width // pw)
        shards = self.sequence_split()
        reason = inference_only_error(shards)
        if reason is not None:
            raise RuntimeError(reason)

        dtype = self.dtype  # the compute dtype (under layerwise casting, not the weights' storage dtype)
        t_in = self._timesteps(timestep, batch, frames, hidden_states.device)
        t = self.t_embedder(t_in.flatten(), dtype)
        t0 = self.t_block(t).unflatten(0, t_in.shape)  # [B, 6C] or [B, 1, F, 6C]
        t = t.unflatten(0, t_in.shape)
        if shards is not None:
            check_split(grid[0], math.prod(grid), t_in.dim() == 3, shards)
            if t_in.dim() == 3:  # per frame: this rank's frames (the plan's hooks split the tokens)
                t0, t = local_frames(t0, shards), local_frames(t, shards)
        y, mask = self._caption(encoder_hidden_states, encoder_attention_mask, dtype)

        x = self.x_embedder(hidden_states.to(dtype))
        ropes = {LINEAR: self.rope_linear(*grid, x.device), SOFTMAX: self.rope_softmax(*grid, x.device)}

        block_size = self.config.attn_res_block_size
        sources = _Sources(x, capacity=math.ceil(len(self.blocks) / block_size) + 2)
        partial = None
        skip = self._remaining_blocks_cache
        head = reused = None
        for index, block in enumerate(self.blocks):
            h = sources.mix(self.attn_res.attn_proj, partial)
            delta = self._sublayer(block, h, y, t0, mask, ropes[block.attention_type], "attention")
            partial = delta if partial is None else partial + delta
            h = sources.mix(self.attn_res.mlp_proj, partial)
            partial = partial + self._sublayer(block, h, y, t0, mask, None, "mlp")
            if index == 0 and skip is not None:  # the first block's output: x plus its two deltas
                head = x + partial
                reused = skip.reuse(partial)
                if reused is not None:
                    break
            if (index + 1) % block_size == 0 or index + 1 == len(self.blocks):
                sources.append(partial)
                partial = None
        if reused is not None:
            x = head + reused  # the remaining blocks' contribution as of the last computed step
        else:
            x = sources.mix(self.attn_res.final_proj, None)
            if skip is not None:
                skip.store(x - head)

        out = self.final_layer(x, t)  # [B, N, P·Cout]
        out = out.reshape(batch, *grid, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        out = out.reshape(batch, -1, grid[0] * pt, grid[1] * ph, grid[2] * pw)
        if not return_dict:
            return (out,)
        return Transformer2DModelOutput(sample=out)

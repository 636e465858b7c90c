"""``SanaVideo2Transformer3DModel``: SANA-Video 2.0 as a diffusers model (diffusers has no class for it).

Architecture and numerics follow the release (NVlabs/Sana ``sana_video2.py`` / ``sana_video2_blocks.py``): hybrid
attention (gated linear attention everywhere except the softmax "anchor" layers, which follow a fixed rule), text
cross-attention in every layer, SwiGLU MLPs, AdaLN-style modulation from the timestep, and Block Attention
Residuals in place of a plain residual stream. Parameter and buffer names mirror the original checkpoint keys, so loading an original state dict
is rename-free. Config field names are the original constructor's; the defaults are the 5B release, and
``SanaVideo2Transformer3DModel(hidden_size=4096, depth=40, num_heads=32)`` is the 14B one.

The layers are in :mod:`.embeddings`, :mod:`.blocks` and :mod:`.attention_residual`; the class stays in this module,
the path a saved ``model_index.json`` names it by (``["accelpatch.models.sana_video2.modeling.transformer",
"SanaVideo2Transformer3DModel"]``).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.loaders import PeftAdapterMixin
from diffusers.models.attention import AttentionMixin
from diffusers.models.cache_utils import CacheMixin
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from accelpatch.parallel.sequence import SequenceShards, model_split, split_in_one_process
from accelpatch.models.sana_video2.release import anchor_layer_indices
from accelpatch.models.sana_video2.modeling.attention import RMSNorm, SanaVideo2LinearAttnProcessor
from accelpatch.models.sana_video2.modeling.attention_residual import BlockAttentionResidual, ResidualSources
from accelpatch.models.sana_video2.modeling.blocks import LINEAR, SOFTMAX, FinalLayer, SanaVideo2Block
from accelpatch.models.sana_video2.modeling.embeddings import CaptionEmbedder, PatchEmbed3D, TimestepEmbedder, WanRope3D
from accelpatch.models.sana_video2.modeling.sequence_parallel import CP_PLAN, check_parallel_config, check_split, inference_only_error, local_frames


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
        sources = ResidualSources(x, capacity=math.ceil(len(self.blocks) / block_size) + 2)
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

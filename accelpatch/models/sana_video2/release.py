"""SANA-Video 2.0 release conventions that need no torch: the registry sizes, the softmax-anchor rule, and what a
release ``config.yaml`` means for :class:`~accelpatch.models.sana_video2.modeling.SanaVideo2Transformer3DModel`.

Outside the ``sana_video2`` package on purpose: importing that package imports diffusers and torch (many seconds),
and ``accelpatch convert`` checks a ``--config`` with this module before it imports either. Importing this module
imports only the standard library (PyYAML when a config is read).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Union

__all__ = ["CheckpointError", "REGISTRY", "anchor_layer_indices", "sana_video2_config_from_yaml"]

PathLike = Union[str, "os.PathLike[str]"]

#: The release registry (``SanaVideo2_5B`` / ``_14B``): depth, hidden size, cross-attention heads.
REGISTRY = {"SanaVideo2_5B": dict(depth=32, hidden_size=2560, num_heads=20),
            "SanaVideo2_14B": dict(depth=40, hidden_size=4096, num_heads=32)}


class CheckpointError(ValueError):
    """A checkpoint, or a config for it, that cannot be loaded: the message names the problem (keys, shapes,
    fields)."""



def anchor_layer_indices(depth: int, softmax_ratio: float) -> list[int]:
    """The softmax "anchor" layers of the release rule: ``n = max(1, int(depth·ratio))`` layers spread evenly, the
    k-th at ``int((k+1)·depth/n) - 1`` (5B: 3, 7, ..., 31; 14B: 3, 7, ..., 39)."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an int >= 1, got {depth!r}")
    if not 0.0 < softmax_ratio <= 1.0:
        raise ValueError(f"softmax_ratio must be in (0, 1], got {softmax_ratio!r}")
    count = max(1, int(depth * softmax_ratio))
    step = depth / count
    return [int((k + 1) * step) - 1 for k in range(count)]


# Release config.yaml (sana_video2_checkpoint.md §4). Each architecture field maps to a constructor kwarg. A
# missing field takes upstream's dataclass default (diffusion/utils/config.py), as upstream would. Those defaults
# often differ from the release values, so a real config sets the fields explicitly.
_YAML_MAPPED = {
    # section: {field: (kwarg, upstream default, type)}
    "model": {
        "fp32_attention": ("fp32_attention", True, bool),
        "linear_head_dim": ("linear_head_dim", 32, int),
        "softmax_head_dim": ("softmax_head_dim", 256, int),
        "softmax_ratio": ("softmax_ratio", 0.0, float),
        "mlp_ratio": ("mlp_ratio", 2.5, float),
        "qk_norm": ("qk_norm", False, bool),
        "cross_norm": ("cross_norm", False, bool),
        "class_dropout_prob": ("class_dropout_prob", 0.0, float),
        "attn_res_block_size": ("attn_res_block_size", 8, int),
        # accelpatch extension (upstream takes these from the registry): sizes for models the registry lacks
        "hidden_size": ("hidden_size", None, int),
        "depth": ("depth", None, int),
        "num_heads": ("num_heads", None, int),
    },
    "text_encoder": {
        "caption_channels": ("caption_channels", 2304, int),
        "y_norm": ("y_norm", True, bool),
        "y_norm_scale_factor": ("y_norm_scale_factor", 1.0, float),
        "model_max_length": ("model_max_length", 300, int),
    },
    "vae": {"vae_latent_dim": ("in_channels", 32, int)},
    "scheduler": {
        "pred_sigma": ("pred_sigma", False, bool),
        "timestep_norm_scale_factor": ("timestep_norm_scale_factor", 1.0, float),
    },
}
#: Read here but not passed on as a kwarg: the registry name, and what ``input_size`` is derived from.
_YAML_READ = {"model": {"model", "image_size"}, "vae": {"vae_stride", "vae_downsample_rate"}}
#: Fields whose only supported value is the release's (upstream default in brackets when missing).
_YAML_FIXED = {"model": {"ffn_type": ("SwiGLU", "glumbconv"), "use_pe": (True, False),
                         "pos_embed_type": ("wan_rope", "sincos"), "rope_fhw_dim": (None, None)}}
#: Fields of other Sana video models that the SanaVideo2 builder never reads. Their default value is accepted;
#: any other value describes a different model and is refused.
_YAML_OTHER_MODELS = {"model": {
    "pe_interpolation": 1.0, "micro_condition": False, "attn_type": "linear", "mlp_acts": ["silu", "silu", None],
    "t_kernel_size": 3, "flash_attn_window_count": None, "pack_latents": False, "additional_inchannels": 0,
    "encode_image_prompt_embeds": False, "cross_attn_image_embeds": False, "image_latent_mode": "video_zero",
    "chunk_index": None, "softmax_layer_indices": None, "softmax_attn_type": "V2VGatedSoftmaxAttention",
    "logvar": False, "cfg_embed": False, "cfg_embed_scale": 1.0,
}}
#: Training, data, runtime and pipeline fields: no effect on the transformer's weights or math.
_YAML_IGNORED = {
    "model": {"mixed_precision", "load_from", "multi_scale", "teacher", "discriminator_model",
              "teacher_model", "teacher_model_weight_dtype", "resume_from", "aspect_ratio_type",
              "autocast_linear_attn", "cross_attn_type", "cfg_scale", "guidance_type", "pag_applied_layers",
              "ladd_multi_scale", "head_block_ids", "remove_state_dict_keys", "extra"},
    "text_encoder": {"text_encoder_name", "chi_prompt", "extra"},
    "vae": {"vae_type", "vae_pretrained", "weight_dtype", "scale_factor", "scaling_factor", "sample_posterior",
            "use_causal_encode", "if_cache", "cache_dir", "use_framewise_encoding", "use_framewise_decoding",
            "tile_sample_stride_num_frames", "tile_sample_min_num_frames", "extra"},
    "scheduler": {"train_sampling_steps", "predict_flow_v", "predict_v", "noise_schedule", "learn_sigma",
                  "vis_sampler", "flow_shift", "inference_flow_shift", "weighting_scheme",
                  "weighting_scheme_discriminator", "add_noise_timesteps", "logit_mean", "logit_std",
                  "logit_mean_discriminator", "logit_std_discriminator", "mode_scale", "sigma_data", "p_low",
                  "p_high", "pretrain_timestep_norm_scale_factor", "discrete_norm_timestep", "extra"},
}


def _typed(value: Any, kind: type, where: str) -> Any:
    """``value`` if it has the YAML type ``kind`` (an int is accepted for a float); else a CheckpointError."""
    if kind is bool:
        ok, wanted = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        ok, wanted = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    if not ok:
        raise CheckpointError(f"{where} must be {wanted}, got {value!r}")
    return float(value) if kind is float else value


def sana_video2_config_from_yaml(path: PathLike) -> dict[str, Any]:
    """Constructor kwargs from a release ``config.yaml`` (read with ``yaml.safe_load``).

    The sections map as upstream's ``model_video_init_config`` does (checkpoint reference §4). ``model.model``
    picks the registry sizes (``SanaVideo2_5B``: depth 32, hidden 2560, 20 heads; ``SanaVideo2_14B``: 40 / 4096 /
    32). Explicit ``model.hidden_size`` / ``depth`` / ``num_heads`` override them; this is an accelpatch extension
    for other sizes. ``input_size = model.image_size // vae.vae_stride[-1]`` (or ``vae_downsample_rate``).
    ``model.fp32_attention`` is passed on. A missing field takes upstream's dataclass default, as upstream would.
    Refused, with the field named: unknown fields in the four architecture sections, ``ffn_type`` other than SwiGLU,
    ``use_pe`` false, ``pos_embed_type`` other than wan_rope, a ``rope_fhw_dim``, and non-default values of fields
    that only other Sana models use. Training, data and pipeline fields are ignored (listed in this module).
    """
    path = Path(path)
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml comes with huggingface_hub / accelerate
        raise CheckpointError("reading a config.yaml needs PyYAML (pip install pyyaml)") from None
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the config: {error}") from None
    except yaml.YAMLError as error:
        raise CheckpointError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("model"), Mapping):
        raise CheckpointError(f"{path}: expected a release config with a 'model:' section")
    sections = {}
    for name in _YAML_MAPPED:
        section = document.get(name) or {}
        if not isinstance(section, Mapping):
            raise CheckpointError(f"{path}: '{name}:' must be a mapping, got {type(section).__name__}")
        sections[name] = section

    problems: list[str] = []
    kwargs: dict[str, Any] = {}
    for name, section in sections.items():
        known = (set(_YAML_MAPPED[name]) | _YAML_READ.get(name, set()) | set(_YAML_FIXED.get(name, {}))
                 | set(_YAML_OTHER_MODELS.get(name, {})) | _YAML_IGNORED[name])
        unknown = sorted(str(key) for key in section if key not in known)
        if unknown:
            problems.append(f"unknown field{'s' if len(unknown) > 1 else ''} in '{name}:': {', '.join(unknown)} "
                            "(accelpatch refuses fields it cannot map rather than ignore a possible architecture "
                            "change)")
        for key, (kwarg, default, kind) in _YAML_MAPPED[name].items():
            if key in section:
                try:
                    kwargs[kwarg] = _typed(section[key], kind, f"{name}.{key}")
                except CheckpointError as error:
                    problems.append(str(error))
            elif default is not None:
                kwargs[kwarg] = default
        for key, (wanted, default) in _YAML_FIXED.get(name, {}).items():
            value = section.get(key, default)
            if value != wanted or type(value) is not type(wanted):
                note = "" if key in section else " (the field is missing, so upstream uses its default)"
                problems.append(f"{name}.{key} is {value!r}{note}; SANA-Video 2.0 supports only {wanted!r}")
        for key, default in _YAML_OTHER_MODELS.get(name, {}).items():
            if key in section and section[key] != default and key != "softmax_layer_indices":
                problems.append(f"{name}.{key} is {section[key]!r}: the SanaVideo2 model never reads it, and a value "
                                f"other than {default!r} describes a different model")

    model = sections["model"]
    registry_name = model.get("model")
    explicit = {key: kwargs[key] for key in ("hidden_size", "depth", "num_heads") if key in kwargs}
    if registry_name is not None and registry_name not in REGISTRY:
        problems.append(f"model.model is {registry_name!r}; known SANA-Video 2.0 models: {', '.join(REGISTRY)}")
    elif registry_name is None and len(explicit) < 3:
        problems.append("model.model is missing: name SanaVideo2_5B or SanaVideo2_14B, or give model.hidden_size, "
                        "model.depth and model.num_heads")
    else:
        kwargs.update({**REGISTRY.get(registry_name, {}), **explicit})

    stride = sections["vae"].get("vae_stride")
    if stride is not None:
        if not isinstance(stride, (list, tuple)) or not stride or not isinstance(stride[-1], int) or stride[-1] < 1:
            problems.append(f"vae.vae_stride must be a list of positive integers, got {stride!r}")
            stride = None
        else:
            stride = stride[-1]
    if stride is None:
        stride = sections["vae"].get("vae_downsample_rate", 32)
    image_size = model.get("image_size", 512)
    if not isinstance(image_size, int) or not isinstance(stride, int) or stride < 1 or image_size // stride < 1:
        problems.append(f"model.image_size {image_size!r} with VAE stride {stride!r} gives no latent size")
    else:
        kwargs["input_size"] = image_size // stride

    ratio = kwargs.get("softmax_ratio")
    if isinstance(ratio, float) and not 0.0 < ratio <= 1.0:
        note = "" if "softmax_ratio" in model else " (the field is missing, so upstream uses its default)"
        problems.append(f"model.softmax_ratio is {ratio!r}{note}; it must be in (0, 1] (the release uses 0.25)")
    indices = model.get("softmax_layer_indices")
    if indices is not None and not problems:
        rule = anchor_layer_indices(kwargs["depth"], kwargs["softmax_ratio"])
        if not isinstance(indices, list) or indices != rule:
            problems.append(f"model.softmax_layer_indices is {indices!r}, but SANA-Video 2.0 places its anchors by "
                            f"softmax_ratio ({rule})")
    if problems:
        raise CheckpointError(f"{path}: cannot build SANA-Video 2.0 from this config: " + "; ".join(problems))
    return kwargs

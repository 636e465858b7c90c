"""Loading released SANA-Video 2.0 weights (original NVlabs/Sana format) and converting them to diffusers.

The synthetic checkpoints here are built from the key table of the original NVlabs/Sana checkpoint (a reference
note outside this repository, §2), written out below as key → shape formulas. They do not come from our model's ``state_dict``, so a naming or shape
drift in the model is caught. Bit identity is checked with ``torch.equal``.
"""
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from accelpatch.__main__ import main
from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel, anchor_layer_indices
from accelpatch.models.sana_video2.modeling.convert import (CheckpointError, UnsafeCheckpointError, convert_sana_video2,
                                                     infer_sana_video2_config, sana_video2_config_from_yaml)
from accelpatch.testing.sana_video2 import (SANA_VIDEO2_14B_CONFIG, SANA_VIDEO2_5B_CONFIG, SANA_VIDEO2_TINY_CONFIG,
                                            sana_video2_transformer_inputs, sana_video2_transformer_on_meta,
                                            tiny_sana_video2_transformer)

BUFFERS = {"pos_embed", "y_embedder.y_embedding"}


# -- the original key table (reference §2), independent of our model --------------------------------------------


def original_key_shapes(*, C, depth, anchors, Cin, Ccap, L, S, dl, mlp_ratio=4.0, patch=(1, 1, 1)):
    """Every key of an original checkpoint with its shape (reference §2.1-2.2; pred_sigma false, so Cout = Cin)."""
    F, Hl, P = int(C * mlp_ratio), C // dl, math.prod(patch)
    keys = {
        "pos_embed": (1, S * S, C),
        "x_embedder.proj.weight": (C, Cin, *patch), "x_embedder.proj.bias": (C,),
        "t_embedder.mlp.0.weight": (C, 256), "t_embedder.mlp.0.bias": (C,),
        "t_embedder.mlp.2.weight": (C, C), "t_embedder.mlp.2.bias": (C,),
        "t_block.1.weight": (6 * C, C), "t_block.1.bias": (6 * C,),
        "y_embedder.y_proj.fc1.weight": (C, Ccap), "y_embedder.y_proj.fc1.bias": (C,),
        "y_embedder.y_proj.fc2.weight": (C, C), "y_embedder.y_proj.fc2.bias": (C,),
        "y_embedder.y_embedding": (L, Ccap),
        "attention_y_norm.weight": (C,),
        "final_layer.linear.weight": (P * Cin, C), "final_layer.linear.bias": (P * Cin,),
        "final_layer.scale_shift_table": (2, C),
        "attn_res.attn_proj.weight": (1, C), "attn_res.mlp_proj.weight": (1, C), "attn_res.final_proj.weight": (1, C),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        keys.update({
            b + "scale_shift_table": (6, C),
            b + "attn.qkv.weight": (3 * C, C), b + "attn.q_norm.weight": (C,), b + "attn.k_norm.weight": (C,),
            b + "attn.output_gate.weight": (C, C), b + "attn.output_gate.bias": (C,),
            b + "attn.proj.weight": (C, C), b + "attn.proj.bias": (C,),
            b + "cross_attn.q_linear.weight": (C, C), b + "cross_attn.q_linear.bias": (C,),
            b + "cross_attn.kv_linear.weight": (2 * C, C), b + "cross_attn.kv_linear.bias": (2 * C,),
            b + "cross_attn.proj.weight": (C, C), b + "cross_attn.proj.bias": (C,),
            b + "cross_attn.q_norm.weight": (C,), b + "cross_attn.k_norm.weight": (C,),
            b + "mlp.gate_proj.weight": (F, C), b + "mlp.gate_proj.bias": (F,),
            b + "mlp.up_proj.weight": (F, C), b + "mlp.up_proj.bias": (F,),
            b + "mlp.down_proj.weight": (C, F), b + "mlp.down_proj.bias": (C,),
        })
        if i not in anchors:  # linear-attention layers
            keys.update({b + "attn.beta_proj.weight": (Hl, C), b + "attn.beta_proj.bias": (Hl,),
                         b + "attn.o_norm.weight": (dl,)})
    return keys


TINY_TABLE = dict(C=64, depth=4, anchors=[3], Cin=8, Ccap=32, L=8, S=2, dl=16)
RELEASE_5B_TABLE = dict(C=2560, depth=32, anchors=list(range(3, 32, 4)), Cin=128, Ccap=2304, L=300, S=15, dl=128)
RELEASE_14B_TABLE = dict(C=4096, depth=40, anchors=list(range(3, 40, 4)), Cin=128, Ccap=2304, L=300, S=15, dl=128)
# Cross-attention heads C/128 and softmax head dim 256 fit, so config=None can infer everything.
INFERABLE_TABLE = dict(C=256, depth=2, anchors=[1], Cin=8, Ccap=32, L=8, S=2, dl=128)


def synthetic_state_dict(table, *, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in original_key_shapes(**table).items():
        if key == "pos_embed":
            tensor = torch.zeros(shape)
        elif key.endswith("norm.weight"):
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif key.startswith("attn_res."):
            tensor = torch.randn(shape, generator=g)  # non-trivial depth mixing
        elif len(shape) >= 2:
            tensor = torch.randn(shape, generator=g) / math.prod(shape[1:]) ** 0.5
        else:
            tensor = 0.1 * torch.randn(shape, generator=g)
        state[key] = tensor.to(dtype)
    return state


def parameter_count(shapes):
    return sum(math.prod(shape) for key, shape in shapes.items() if key not in BUFFERS)


def output(model, config=None):
    inputs = sana_video2_transformer_inputs(config or dict(model.config), dtype=model.dtype)
    with torch.no_grad():
        return model(**inputs).sample


def reference_model(state, config=SANA_VIDEO2_TINY_CONFIG):
    """A model built the ordinary way, with the original tensors copied in by name."""
    model = tiny_sana_video2_transformer(config)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name != "pos_embed":
                tensor.copy_(state[name])
    return model


@pytest.fixture(scope="module")
def tiny_state():
    return synthetic_state_dict(TINY_TABLE)


@pytest.fixture(scope="module")
def tiny_pth(tmp_path_factory, tiny_state):
    path = tmp_path_factory.mktemp("ckpt") / "sana_video2_tiny.pth"
    torch.save({"state_dict": tiny_state}, path)
    return path


@pytest.fixture(scope="module")
def tiny_reference_output(tiny_state):
    return output(reference_model(tiny_state))


@pytest.fixture
def load_calls(monkeypatch):
    """Records every load_state_dict on the model class: empty after a refused checkpoint (no partial load)."""
    calls = []
    original = SanaVideo2Transformer3DModel.load_state_dict

    def spy(self, *args, **kwargs):
        calls.append(sorted(args[0]) if args else None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SanaVideo2Transformer3DModel, "load_state_dict", spy)
    return calls


def load(source, config=SANA_VIDEO2_TINY_CONFIG, **kwargs):
    return SanaVideo2Transformer3DModel.from_original_checkpoint(source, config=config, **kwargs)


# -- key table, parameter totals, anchors -------------------------------------------------------------------------


@pytest.mark.parametrize("table,keys,parameters", [
    (TINY_TABLE, 118, 404_612), (RELEASE_5B_TABLE, 797, 4_466_980_960), (RELEASE_14B_TABLE, 991, 14_246_716_224),
])
def test_key_table_gives_the_reference_totals(table, keys, parameters):
    shapes = original_key_shapes(**table)
    assert len(shapes) == keys
    assert parameter_count(shapes) == parameters


@pytest.mark.parametrize("config,table,parameters", [
    (SANA_VIDEO2_TINY_CONFIG, TINY_TABLE, 404_612),
    (SANA_VIDEO2_5B_CONFIG, RELEASE_5B_TABLE, 4_466_980_960),
    (SANA_VIDEO2_14B_CONFIG, RELEASE_14B_TABLE, 14_246_716_224),
])
def test_model_on_meta_has_the_original_keys_shapes_and_totals(config, table, parameters):
    model = sana_video2_transformer_on_meta(config)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == original_key_shapes(**table)
    assert sum(p.numel() for p in model.parameters()) == parameters


@pytest.mark.parametrize("depth,ratio,anchors", [
    (4, 0.25, [3]), (4, 0.5, [1, 3]), (32, 0.25, [3, 7, 11, 15, 19, 23, 27, 31]),
    (40, 0.25, [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]),
])
def test_anchor_rule(depth, ratio, anchors):
    assert anchor_layer_indices(depth, ratio) == anchors


# -- a good checkpoint --------------------------------------------------------------------------------------------


def test_loads_the_synthetic_checkpoint_exactly(tiny_pth, tiny_state, tiny_reference_output, load_calls):
    model = load(tiny_pth)
    loaded = model.state_dict()
    assert set(loaded) == set(original_key_shapes(**TINY_TABLE))  # no missing, no unexpected key
    for name, tensor in tiny_state.items():
        assert torch.equal(loaded[name], tensor), name
    assert not model.training and all(p.device.type == "cpu" for p in model.parameters())
    assert len(load_calls) == 1
    assert torch.equal(output(model), tiny_reference_output)


@pytest.mark.parametrize("key", ["blocks.1.attn.beta_proj.weight", "blocks.3.attn.qkv.weight",
                                 "attn_res.final_proj.weight", "final_layer.scale_shift_table"])
def test_perturbing_one_original_tensor_changes_the_output(tmp_path, tiny_state, tiny_reference_output, key):
    state = dict(tiny_state)
    state[key] = state[key] + 0.05 * torch.randn(state[key].shape, generator=torch.Generator().manual_seed(1))
    torch.save({"state_dict": state}, tmp_path / "perturbed.pth")
    assert not torch.equal(output(load(tmp_path / "perturbed.pth")), tiny_reference_output)


def test_in_memory_state_dict(tiny_state, tiny_reference_output):
    before = dict(tiny_state)
    model = load(tiny_state)
    assert torch.equal(output(model), tiny_reference_output)
    assert tiny_state.keys() == before.keys() and all(tiny_state[k] is before[k] for k in before)


@pytest.mark.parametrize("wrap", ["generator", "state_dict_ema", "module.", "model.", "state_dict+module."])
def test_wrappers_and_prefixes(tmp_path, tiny_state, tiny_reference_output, wrap):
    if wrap == "generator":  # preferred over state_dict, as upstream
        bogus = {k: torch.zeros_like(v) for k, v in tiny_state.items()}
        checkpoint = {"generator": tiny_state, "state_dict": bogus, "epoch": 3}
    elif wrap == "state_dict_ema":
        checkpoint = {"state_dict_ema": tiny_state, "step": 10}
    elif wrap == "state_dict+module.":
        checkpoint = {"state_dict": {"module." + k: v for k, v in tiny_state.items()}}
    else:
        checkpoint = {wrap + k: v for k, v in tiny_state.items()}
    torch.save(checkpoint, tmp_path / "wrapped.pt")
    assert torch.equal(output(load(tmp_path / "wrapped.pt")), tiny_reference_output)


def test_safetensors_without_the_unused_buffers(tmp_path, tiny_state, tiny_reference_output):
    state = {k: v for k, v in tiny_state.items() if k not in BUFFERS}
    save_file(state, tmp_path / "tiny.safetensors")
    first, second = load(tmp_path / "tiny.safetensors"), load(tmp_path / "tiny.safetensors")
    assert torch.equal(output(first), tiny_reference_output)
    assert torch.equal(first.pos_embed, torch.zeros(1, 4, 64))
    embedding = first.y_embedder.y_embedding
    assert embedding.shape == (8, 32) and not embedding.is_meta and torch.isfinite(embedding).all()
    assert torch.equal(embedding, second.y_embedder.y_embedding)  # materialised from a fixed seed


def test_pos_embed_of_another_training_size_is_accepted(tmp_path, tiny_state, tiny_reference_output):
    state = dict(tiny_state, pos_embed=torch.randn(1, 9, 64))  # S = 3, not the config's 2
    model = load(state)
    assert torch.equal(model.pos_embed, torch.zeros(1, 4, 64))
    assert torch.equal(output(model), tiny_reference_output)


def test_torch_dtype_bf16(tiny_pth, tiny_state, tmp_path):
    model = load(tiny_pth, torch_dtype=torch.bfloat16)
    loaded = model.state_dict()
    assert {t.dtype for t in loaded.values()} == {torch.bfloat16}
    for name, tensor in tiny_state.items():
        if name != "pos_embed":
            assert torch.equal(loaded[name], tensor.to(torch.bfloat16)), name
    assert torch.isfinite(output(model).float()).all()
    # without torch_dtype a bf16 checkpoint stays bf16
    torch.save({"state_dict": {k: v.to(torch.bfloat16) for k, v in tiny_state.items()}}, tmp_path / "bf16.pth")
    assert {t.dtype for t in load(tmp_path / "bf16.pth").state_dict().values()} == {torch.bfloat16}


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_the_model_owns_its_weights_once_loaded(tmp_path, tiny_state, tiny_reference_output, suffix):
    """No parameter is a view of the checkpoint file: overwriting every byte of the file in place, then truncating
    and deleting it, changes no weight and no output (a view of a mapped file would change, then crash)."""
    path = tmp_path / f"ckpt{suffix}"
    if suffix == ".pth":
        torch.save({"state_dict": tiny_state}, path)
    else:
        save_file(tiny_state, path)
    model = load(path)
    loaded = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with open(path, "r+b") as file:  # same inode, every byte rewritten: what a mapping would show
        file.write(b"\xff" * path.stat().st_size)
    changed = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, loaded[name])]
    assert changed == []
    assert torch.equal(output(model), tiny_reference_output)
    os.truncate(path, 0)
    path.unlink()
    assert all(torch.equal(tensor, loaded[name]) for name, tensor in model.state_dict().items())
    assert torch.equal(output(model), tiny_reference_output)


# -- bad checkpoints: a clear error and nothing loaded ---------------------------------------------------------


def _missing(state):
    return {k: v for k, v in state.items() if k != "blocks.2.mlp.up_proj.weight"}


def _extra(state):
    return dict(state, **{"blocks.0.attn.lora_A.weight": torch.zeros(4, 64)})


def _wrong_shape(state):
    return dict(state, **{"blocks.1.cross_attn.kv_linear.weight": torch.zeros(96, 64)})


def _bad_pos_embed(state):
    return dict(state, pos_embed=torch.zeros(1, 5, 64))


def _integer(state):
    return dict(state, **{"t_block.1.bias": torch.zeros(384, dtype=torch.int32)})


@pytest.mark.parametrize("corrupt,expected", [
    (_missing, "1 missing key: blocks.2.mlp.up_proj.weight"),
    (_extra, "1 unexpected key: blocks.0.attn.lora_A.weight"),
    (_wrong_shape, "blocks.1.cross_attn.kv_linear.weight (checkpoint [96, 64], model [128, 64])"),
    (_bad_pos_embed, "pos_embed (checkpoint [1, 5, 64], expected [1, S², 64] for some S)"),
    (_integer, "not floating point: t_block.1.bias (torch.int32)"),
])
def test_bad_checkpoint_is_refused_naming_the_key(tmp_path, tiny_state, load_calls, corrupt, expected):
    torch.save({"state_dict": corrupt(tiny_state)}, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as error:
        load(tmp_path / "bad.pth")
    assert expected in str(error.value) and "Nothing was loaded" in str(error.value)
    assert load_calls == []  # validated before anything was assigned


def test_many_missing_keys_are_listed_sorted_then_counted(tiny_state, load_calls):
    state = {k: v for k, v in tiny_state.items() if not k.startswith(("blocks.1.", "blocks.2."))}
    missing = sorted(set(tiny_state) - set(state))
    assert len(missing) == 50
    with pytest.raises(CheckpointError) as error:
        load(state)
    assert f"50 missing keys: {', '.join(missing[:20])} and 30 more" in str(error.value)
    assert load_calls == []


def test_wrong_anchor_layout_is_explained(tiny_state, load_calls):
    with pytest.raises(CheckpointError, match=r"softmax anchors .* are \[3\]; the config's are \[1, 3\]"):
        load(tiny_state, config=dict(SANA_VIDEO2_TINY_CONFIG, softmax_ratio=0.5))
    assert load_calls == []


PAYLOAD_RAN = []


def _payload(tag):
    PAYLOAD_RAN.append(tag)
    return tag


class NeedsFullPickle:
    """Unpickling an instance calls _payload: a stand-in for code hidden in a checkpoint."""

    def __reduce__(self):
        return (_payload, ("code ran",))


def test_unsafe_pickle_is_refused_without_running_its_code(tmp_path, tiny_state, load_calls):
    path = tmp_path / "unsafe.pth"
    torch.save({"state_dict": tiny_state, "trainer": NeedsFullPickle()}, path)
    PAYLOAD_RAN.clear()
    with pytest.raises(UnsafeCheckpointError) as error:
        load(path)
    message = str(error.value)
    for needle in ("weights_only=False", "execute arbitrary code", "_payload", "only if you trust",
                   "safetensors", "pass the state dict"):
        assert needle in message.lower() or needle in message, needle
    assert PAYLOAD_RAN == [] and load_calls == []
    # the control: this file really does run code when unpickled without weights_only
    torch.load(path, weights_only=False)
    assert PAYLOAD_RAN == ["code ran"]


def test_legacy_pickle_format(tmp_path, tiny_state, tiny_reference_output, load_calls):
    """The pre-zip format cannot be memory-mapped: it is read into memory, still with weights_only=True."""
    torch.save({"state_dict": tiny_state}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    assert torch.equal(output(load(tmp_path / "legacy.pth")), tiny_reference_output)
    torch.save({"state_dict": tiny_state, "x": NeedsFullPickle()}, tmp_path / "unsafe_legacy.pth",
               _use_new_zipfile_serialization=False)
    PAYLOAD_RAN.clear()
    with pytest.raises(UnsafeCheckpointError):
        load(tmp_path / "unsafe_legacy.pth")
    assert PAYLOAD_RAN == [] and len(load_calls) == 1


def test_unreadable_file_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "garbage.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a readable torch checkpoint"):
        load(tmp_path / "garbage.pth")
    (tmp_path / "weights.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="unknown checkpoint format '.ckpt'"):
        load(tmp_path / "weights.ckpt")
    with pytest.raises(CheckpointError, match="no such file"):
        load(tmp_path / "absent.pth")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_an_empty_file_is_called_empty(tmp_path, suffix):
    (tmp_path / f"empty{suffix}").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.\w+ is empty \(0 bytes\), not a checkpoint"):
        load(tmp_path / f"empty{suffix}")


def test_a_legacy_pickle_cut_short_says_what_is_wrong(tmp_path, tiny_state):
    path = tmp_path / "legacy.pth"
    torch.save({"state_dict": tiny_state}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:5])
    with pytest.raises(CheckpointError) as error:
        load(path)
    reason = str(error.value).split("is not a readable torch checkpoint:")[1]
    assert reason.strip(), str(error.value)  # never a colon with nothing after it


# -- configs ----------------------------------------------------------------------------------------------------


def release_yaml(**sizes):
    """A config.yaml laid out like the release's (checkpoint reference §4, with the training sections)."""
    document = {
        "task": "t2v", "work_dir": "output/sana_video2_5b",
        "data": {"image_size": 480, "num_frames": 81, "target_fps": 16},
        "model": {"model": "SanaVideo2_5B", "image_size": 480, "mixed_precision": "bf16", "fp32_attention": True,
                  "load_from": None, "multi_scale": False, "linear_head_dim": 128, "softmax_head_dim": 256,
                  "softmax_ratio": 0.25, "ffn_type": "SwiGLU", "mlp_ratio": 4.0, "use_pe": True,
                  "pos_embed_type": "wan_rope", "qk_norm": True, "cross_norm": True, "class_dropout_prob": 0.1,
                  "attn_res_block_size": 8},
        "vae": {"vae_type": "LTX2VAE_diffusers", "vae_pretrained": "output/pretrained_models/LTX-2.3-Diffusers",
                "weight_dtype": "bfloat16", "vae_latent_dim": 128, "vae_downsample_rate": 32,
                "vae_stride": [8, 32, 32], "sample_posterior": False, "use_causal_encode": True},
        "text_encoder": {"text_encoder_name": "gemma-2-2b-it", "caption_channels": 2304, "y_norm": True,
                         "y_norm_scale_factor": 0.01, "model_max_length": 300,
                         "chi_prompt": ["Given a user prompt, ...", "User Prompt: "]},
        "scheduler": {"train_sampling_steps": 1000, "predict_flow_v": True, "noise_schedule": "linear_flow",
                      "pred_sigma": False, "learn_sigma": False, "flow_shift": 3.0, "inference_flow_shift": 6.0,
                      "weighting_scheme": "logit_normal", "logit_mean": 0.0, "logit_std": 0.95,
                      "vis_sampler": "flow_dpm-solver"},
        "train": {"use_fsdp": True, "seed": 1, "optimizer": {"type": "AdamW", "lr": 5.0e-5}},
    }
    for dotted, value in sizes.items():
        section, key = dotted.split("__")
        if value is None:
            document[section].pop(key, None)
        else:
            document[section][key] = value
    return document


TINY_YAML = dict(model__hidden_size=64, model__depth=4, model__num_heads=4, model__linear_head_dim=16,
                 model__softmax_head_dim=32, model__attn_res_block_size=3, model__image_size=64,
                 vae__vae_latent_dim=8, text_encoder__caption_channels=32, text_encoder__model_max_length=8)


def write_yaml(tmp_path, document, name="config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_release_yaml_maps_to_the_registry_sizes(tmp_path):
    kwargs = sana_video2_config_from_yaml(write_yaml(tmp_path, release_yaml()))
    assert kwargs == dict(depth=32, hidden_size=2560, num_heads=20, input_size=15, in_channels=128,
                          caption_channels=2304, model_max_length=300, linear_head_dim=128, softmax_head_dim=256,
                          softmax_ratio=0.25, mlp_ratio=4.0, qk_norm=True, cross_norm=True, y_norm=True,
                          y_norm_scale_factor=0.01, class_dropout_prob=0.1, attn_res_block_size=8,
                          fp32_attention=True, pred_sigma=False, timestep_norm_scale_factor=1.0)
    kwargs = sana_video2_config_from_yaml(write_yaml(tmp_path, release_yaml(
        model__model="SanaVideo2_14B", model__fp32_attention=False, model__image_size=720)))
    assert (kwargs["depth"], kwargs["hidden_size"], kwargs["num_heads"]) == (40, 4096, 32)
    assert kwargs["fp32_attention"] is False and kwargs["input_size"] == 22


def test_release_style_yaml_for_the_tiny_sizes_loads(tmp_path, tiny_pth, tiny_reference_output):
    path = write_yaml(tmp_path, release_yaml(**TINY_YAML))
    model = load(tiny_pth, config=path)
    assert {k: model.config[k] for k in SANA_VIDEO2_TINY_CONFIG} == SANA_VIDEO2_TINY_CONFIG
    assert model.config["fp32_attention"] is True
    assert torch.equal(output(model), tiny_reference_output)


@pytest.mark.parametrize("change,expected", [
    (dict(model__ffn_type="GLUMBConv"), "model.ffn_type is 'GLUMBConv'; SANA-Video 2.0 supports only 'SwiGLU'"),
    (dict(model__pos_embed_type="sincos"), "model.pos_embed_type is 'sincos'"),
    (dict(model__ffn_type=None), "model.ffn_type is 'glumbconv' (the field is missing"),
    (dict(model__softmax_ratio=None), "model.softmax_ratio is 0.0 (the field is missing"),
    (dict(model__gated_ffn=True), "unknown field in 'model:': gated_ffn"),
    (dict(scheduler__new_sampler_knob=1), "unknown field in 'scheduler:': new_sampler_knob"),
    (dict(model__additional_inchannels=16), "model.additional_inchannels is 16"),
    (dict(model__model="SanaVideo2_2B"), "model.model is 'SanaVideo2_2B'"),
    (dict(model__qk_norm="yes"), "model.qk_norm must be true or false, got 'yes'"),
])
def test_yaml_with_an_unsupported_field_is_refused(tmp_path, tiny_pth, load_calls, change, expected):
    path = write_yaml(tmp_path, release_yaml(**{**TINY_YAML, **change}))
    with pytest.raises(CheckpointError) as error:
        load(tiny_pth, config=path)
    assert expected in str(error.value)
    assert load_calls == []


def test_dict_config_with_an_unknown_field_is_refused(tiny_state):
    with pytest.raises(CheckpointError, match="unknown config field hidden_dim"):
        load(tiny_state, config=dict(SANA_VIDEO2_TINY_CONFIG, hidden_dim=64))


def _meta_state(table, **changes):
    shapes = original_key_shapes(**table)
    shapes.update(changes)
    return {k: torch.empty(shape, device="meta") for k, shape in shapes.items()}


def test_config_inferred_from_release_shapes():
    inferred = infer_sana_video2_config(_meta_state(RELEASE_5B_TABLE))
    assert inferred == dict(in_channels=128, hidden_size=2560, depth=32, num_heads=20, linear_head_dim=128,
                            softmax_head_dim=256, softmax_ratio=0.25, mlp_ratio=4.0, caption_channels=2304,
                            patch_size=(1, 1, 1), pred_sigma=False, qk_norm=True, cross_norm=True, y_norm=True,
                            model_max_length=300, input_size=15)
    inferred = infer_sana_video2_config(_meta_state(RELEASE_14B_TABLE, pos_embed=(1, 484, 4096)))  # a 720p pos_embed
    assert (inferred["depth"], inferred["hidden_size"], inferred["num_heads"], inferred["softmax_ratio"],
            inferred["input_size"]) == (40, 4096, 32, 0.25, 22)


def test_inference_refuses_anchors_off_the_release_rule():
    state = {k: v for k, v in _meta_state(dict(RELEASE_5B_TABLE, anchors=[0, 3])).items()}
    with pytest.raises(CheckpointError, match=r"are \[0, 3\], which is not the release anchor rule"):
        infer_sana_video2_config(state)


def test_inference_asks_for_a_config_when_the_heads_do_not_fit(tiny_state):
    with pytest.raises(CheckpointError, match="pass config="):
        load(tiny_state, config=None)


def test_config_none_loads_an_inferable_checkpoint():
    state = synthetic_state_dict(INFERABLE_TABLE, seed=3)
    model = load(state, config=None)
    config = dict(in_channels=8, hidden_size=256, depth=2, num_heads=2, linear_head_dim=128, softmax_head_dim=256,
                  softmax_ratio=0.25, caption_channels=32, model_max_length=8, input_size=2)
    assert {k: model.config[k] for k in config} == config and model.config["attn_res_block_size"] == 8
    assert torch.equal(output(model), output(reference_model(state, dict(config, attn_res_block_size=8))))


# -- diffusers folders and the command line --------------------------------------------------------------------


def test_save_pretrained_round_trip(tmp_path, tiny_pth, tiny_reference_output):
    load(tiny_pth).save_pretrained(tmp_path / "diffusers", safe_serialization=True)
    reloaded = SanaVideo2Transformer3DModel.from_pretrained(tmp_path / "diffusers")
    assert torch.equal(output(reloaded), tiny_reference_output)


def test_convert_writes_a_sharded_folder_that_loads(tmp_path, tiny_pth, tiny_reference_output):
    out = tmp_path / "sharded"
    summary = convert_sana_video2(tiny_pth, out, config=SANA_VIDEO2_TINY_CONFIG, max_shard_size="500KB",
                                  progress=False)
    assert summary.parameters == 404_612 and summary.dtype == torch.float32
    assert summary.files[:2] == ("config.json", "diffusion_pytorch_model.safetensors.index.json")
    assert len(summary.files) > 3  # sharded
    assert sorted(p.name for p in out.iterdir()) == sorted(summary.files)
    assert summary.bytes_on_disk == sum((out / name).stat().st_size for name in summary.files)
    assert torch.equal(output(SanaVideo2Transformer3DModel.from_pretrained(out)), tiny_reference_output)
    # converting again, unsharded, into the same folder leaves no stale shard or index
    summary = convert_sana_video2(tiny_pth, out, config=SANA_VIDEO2_TINY_CONFIG, progress=False)
    assert summary.files == ("config.json", "diffusion_pytorch_model.safetensors")
    assert sorted(p.name for p in out.iterdir()) == sorted(summary.files)
    assert torch.equal(output(SanaVideo2Transformer3DModel.from_pretrained(out)), tiny_reference_output)


def test_cli_converts_and_the_folder_loads(tmp_path, tiny_pth, tiny_state, capsys):
    config = write_yaml(tmp_path, release_yaml(**TINY_YAML))
    out = tmp_path / "cli"
    assert main(["convert", "sana-video2", str(tiny_pth), "--config", str(config), "--out", str(out),
                 "--dtype", "bf16", "--max-shard-size", "300KB", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "404,612 (bfloat16)" in printed and str(out) in printed and "from_pretrained" in printed
    assert (out / "diffusion_pytorch_model.safetensors.index.json").is_file()
    stored = {}
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            stored.update({key: handle.get_tensor(key) for key in handle.keys()})
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}  # written in bf16
    model = SanaVideo2Transformer3DModel.from_pretrained(out, torch_dtype=torch.bfloat16)
    for name, tensor in tiny_state.items():
        if name != "pos_embed":
            assert torch.equal(model.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_cli_refuses_a_bad_checkpoint_in_one_line(tmp_path, tiny_state, capsys):
    torch.save({"state_dict": _missing(tiny_state)}, tmp_path / "bad.pth")
    out = tmp_path / "never"
    assert main(["convert", "sana-video2", str(tmp_path / "bad.pth"), "--out", str(out),
                 "--config", str(write_yaml(tmp_path, release_yaml(**TINY_YAML))), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accelpatch convert sana-video2: error: ")
    assert "missing key: blocks.2.mlp.up_proj.weight" in err
    assert not out.exists()


@pytest.mark.parametrize("argv,expected", [
    (["{missing}", "--out", "{out}"], "CKPT {missing}: no such file"),
    (["{ckpt}", "--out", "{out}", "--max-shard-size", "5GiB"], "argument --max-shard-size: must be a positive size"),
    (["{ckpt}", "--out", "{out}", "--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["{ckpt}", "--out", "{out}", "--config", "{ckpt}"], "expected the release config.yaml"),
    (["{ckpt}"], "the following arguments are required: --out"),
])
def test_cli_usage_errors(tmp_path, tiny_pth, capsys, argv, expected):
    names = dict(missing=str(tmp_path / "absent.pth"), out=str(tmp_path / "out"), ckpt=str(tiny_pth))
    with pytest.raises(SystemExit) as exc:
        main(["convert", "sana-video2", *(a.format(**names) for a in argv)])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("accelpatch convert sana-video2: error: ")
    assert expected.format(**names) in errors[0]


def _run_cli_in_a_fresh_process(argv):
    """(exit code, stderr, whether torch was imported) of ``main(argv)`` in a new interpreter."""
    code = ("import sys\nfrom accelpatch.__main__ import main\ntry:\n    code = main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    code = exc.code\nprint('torch imported:', 'torch' in sys.modules)\n"
            "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    return result.returncode, result.stderr, "torch imported: True" in result.stdout


@pytest.mark.parametrize("case", ["bad field", "not yaml", "empty checkpoint"])
def test_cli_checks_config_and_checkpoint_before_importing_torch(tmp_path, tiny_pth, case):
    config = write_yaml(tmp_path, release_yaml(**{**TINY_YAML, "model__gated_ffn": True}))
    ckpt = tiny_pth
    if case == "not yaml":
        config.write_text("model: [unclosed\n")
    elif case == "empty checkpoint":
        config = write_yaml(tmp_path, release_yaml(**TINY_YAML))
        ckpt = tmp_path / "empty.pth"
        ckpt.write_bytes(b"")
    code, err, torch_imported = _run_cli_in_a_fresh_process(
        ["convert", "sana-video2", str(ckpt), "--config", str(config), "--out", str(tmp_path / "out")])
    expected = {"bad field": f"--config {config}: cannot build SANA-Video 2.0 from this config: unknown field in "
                             "'model:': gated_ffn",
                "not yaml": f"--config {config}: not valid YAML",
                "empty checkpoint": f"CKPT {ckpt}: the file is empty (0 bytes), not a checkpoint"}[case]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and expected in errors[0], err
    assert not torch_imported
    assert not (tmp_path / "out").exists()


def test_cli_says_what_it_is_doing_before_the_long_import(tmp_path, tiny_pth, capsys):
    config = write_yaml(tmp_path, release_yaml(**TINY_YAML))
    assert main(["convert", "sana-video2", str(tiny_pth), "--config", str(config), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err.splitlines()[0] == "accelpatch convert: importing torch and diffusers ..."


def test_cli_summary_snippet_runs_as_printed(tmp_path, tiny_pth, capsys):
    config = write_yaml(tmp_path, release_yaml(**TINY_YAML))
    assert main(["convert", "sana-video2", str(tiny_pth), "--config", str(config), "--out", str(tmp_path / "cli"),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    snippet = "\n".join(line[4:] for line in printed[printed.index("  load it with:") + 1:])
    namespace = {}
    exec(compile(snippet, "<summary snippet>", "exec"), namespace)  # a fresh namespace: it imports what it uses
    assert isinstance(namespace["transformer"], SanaVideo2Transformer3DModel)


def test_cli_help_does_not_import_torch():
    code = ("import sys\nfrom accelpatch.__main__ import main\ntry:\n"
            "    main(['convert', 'sana-video2', '--help'])\nexcept SystemExit as exc:\n    assert exc.code == 0\n"
            "print('torch' in sys.modules, 'diffusers' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: accelpatch convert sana-video2" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "False False"

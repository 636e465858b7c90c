"""accelpatch with the tools people put on big video models, each before ``apply()`` and after it, on tiny bf16
models: quantization (torchao, diffusers' TorchAoConfig, optimum-quanto, GGUF), memory (layerwise casting, group
offloading, model CPU offload), LoRA (PEFT), caches (diffusers' FirstBlockCache and MagCache, cache-dit) and
attention backends.

Every combination: at the default tier the output is ``torch.equal`` to the same model with the same tool and no
accelpatch; ``remove()`` gives those bits back; the weights (SHA-256 of the plain tensors behind every state-dict
entry) and ``save_pretrained``'s files never change; a lossless fused op that cannot stand in for a wrapped,
hooked or quantized layer says why in ``report()``. Two step caches on one model are refused, by name. Nothing here
depends on the CPU kind: bit identity and named reasons, not which fused op ran.
"""
from __future__ import annotations

import pytest
import torch

import accelpatch
from accelpatch.core.errors import CacheConflictError
from accelpatch.testing import (WAN_TINY_CONFIG, sana_video_pipeline_call_kwargs, tiny_sana_video_pipeline,
                                tiny_wan_pipeline, wan_pipeline_call_kwargs)

import _works_with_tools as W

ORDERS = ("tool_then_apply", "apply_then_tool")


def _check(family, tool, order, *, config=None, report_check=None):
    """The contract for ``tool`` on ``family``'s tiny bf16 model in ``order``; returns the patched model (removed)."""
    twin = W.build(family, config)  # never patched, same tool
    tool(twin)
    expected, expected_weights = W.forward(twin, family), W.weights(twin)

    model = W.build(family, config)
    if order == "tool_then_apply":
        tool(model)
        before = W.weights(model)
        W.apply(model)
        assert W.weights(model) == before
    else:
        W.apply(model)
        tool(model)
    assert W.weights(model) == expected_weights
    assert torch.equal(W.forward(model, family), expected)
    if report_check is not None:
        report_check(model)
    accelpatch.remove(model)
    W.assert_unpatched(model)
    assert torch.equal(W.forward(model, family), expected)
    assert W.weights(model) == expected_weights
    return model


# -- quantization ------------------------------------------------------------------------------------------------

#: family -> the fused op that stands in for its Linear layers (None: the family's fused ops read no weights)
LINEAR_OP = {"sana_video": "linear", "sana_video2": "linear", "minimax_h3": "linear", "wan": None}
TORCHAO = ("Int8WeightOnlyConfig", "Float8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["sana_video", "sana_video2", "wan"])
@pytest.mark.parametrize("config", TORCHAO)
def test_torchao_quantize(config, family, order):
    """torchao's tensor-subclass weights stay nn.Linear: the fused linear op must never run its kernel on them."""
    op = LINEAR_OP[family]
    _check(family, W.torchao(config), order, report_check=(lambda m: W.assert_never_fused(m, op)) if op else None)


def test_sana_video2_runs_quantized_weights_unpatched_and_patched():
    """SANA-Video 2.0 used to fail under torchao even unpatched (its Attention Residual read a Linear's weight:
    ``Int8Tensor dispatch: ... aten.unsqueeze``); its plain weights keep the einsum and its numbers."""
    from accelpatch.models.sana_video2.modeling.transformer import BlockAttentionResidual

    projection = torch.nn.Linear(32, 1, bias=False).to(torch.bfloat16)
    keys = torch.randn(3, 2, 40, 32, dtype=torch.bfloat16)
    plain = BlockAttentionResidual.logits(projection, keys)
    assert torch.equal(plain, torch.einsum("d,nbtd->nbt", projection.weight[0], keys))
    calls = []
    projection.register_forward_hook(lambda *a: calls.append(1))  # hooked: called, as diffusers calls its layers
    assert torch.equal(BlockAttentionResidual.logits(projection, keys), projection(keys).squeeze(-1)) and calls
    W.need("torchao")
    model = W.build("sana_video2")
    W.torchao("Int8WeightOnlyConfig")(model)
    assert type(model.attn_res.attn_proj.weight).__name__ == "Int8Tensor"
    assert torch.isfinite(W.forward(model, "sana_video2")).all()


@pytest.mark.parametrize("order", ORDERS)
def test_torchao_config_from_pretrained(tmp_path, order):
    """diffusers' TorchAoConfig quantizes at load. The other order: a patched model's saved folder loads into the
    same quantized model as the unpatched one's."""
    W.need("torchao")
    from diffusers import SanaVideoTransformer3DModel, TorchAoConfig
    from torchao.quantization import Int8WeightOnlyConfig

    folder = tmp_path / "plain"
    plain_files = W.saved_files(W.build("sana_video"), folder)
    if order == "apply_then_tool":
        patched = W.build("sana_video")
        W.apply(patched)
        folder = tmp_path / "patched"
        assert W.saved_files(patched, folder) == plain_files
        accelpatch.remove(patched)

    def load():
        return SanaVideoTransformer3DModel.from_pretrained(
            folder, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()), torch_dtype=torch.bfloat16)

    twin = load()
    expected = W.forward(twin, "sana_video")
    model = load()
    assert W.weights(model) == W.weights(twin)
    W.apply(model)
    assert torch.equal(W.forward(model, "sana_video"), expected)
    W.assert_never_fused(model, "linear")
    assert W.saved_files(model, tmp_path / "q", safe_serialization=False) == W.saved_files(
        twin, tmp_path / "q_twin", safe_serialization=False)
    accelpatch.remove(model)
    assert torch.equal(W.forward(model, "sana_video"), expected)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["minimax_h3", "wan"])
def test_quanto_qint8(family, order):
    """optimum-quanto swaps each Linear for its QLinear: the fused linear op runs the layer itself. (SANA-Video in
    bf16 fails unpatched inside quanto: its CPU int8 kernel needs contiguous rows, and SANA's to_out input is not.)"""
    W.need("optimum.quanto")
    op = LINEAR_OP[family]
    calls = 10  # MiniMax-H3's tiny forward: 2 x (to_q, to_k, to_v, to_out) on the blocks + the shared SwiGLU's 2
    _check(family, W.quanto_int8, order,
           report_check=(lambda m: W.assert_ran_itself(m, op, calls, ("QLinear", "quanto"))) if op else None)


@pytest.mark.parametrize("order", ORDERS)
def test_gguf_linear_layers_sana_video(order):
    """GGUF Q8_0 weights as diffusers' GGUF loader leaves them (GGUFLinear, GGUFParameter), built with diffusers'
    own helper: diffusers has no single-file mapping for SanaVideoTransformer3DModel."""
    calls = 2 * 4 * 1  # 2 blocks x to_q, to_k, to_v, to_out[0] x one forward
    _check("sana_video", W.gguf_q8_0, order, config=_sana_config(SANA_ROWS_OF_32),
           report_check=lambda m: W.assert_ran_itself(m, "linear", calls, ("GGUFLinear", "GGUF")))


#: SANA-Video's tiny config with 32-wide attention rows (Q8_0 quantizes blocks of 32 values)
SANA_ROWS_OF_32 = {"num_attention_heads": 2, "attention_head_dim": 16, "cross_attention_dim": 32}


def _sana_config(overrides):
    from accelpatch.testing import SANA_VIDEO_TINY_CONFIG

    return {**SANA_VIDEO_TINY_CONFIG, **overrides}


@pytest.fixture(scope="module")
def wan_gguf(tmp_path_factory):
    """A tiny Wan checkpoint as one GGUF file (Q8_0 Linears) and its config folder."""
    W.need("gguf")
    folder = tmp_path_factory.mktemp("wan_gguf")
    config = {**WAN_TINY_CONFIG, "attention_head_dim": 16, "ffn_dim": 64}  # rows of 32: Q8_0 blocks
    source = W.build("wan", config)
    source.save_config(folder)
    W.write_gguf_checkpoint(source, folder / "wan.gguf")
    return folder


@pytest.mark.parametrize("order", ORDERS)
def test_gguf_from_single_file_wan(wan_gguf, tmp_path, order):
    """``from_single_file(..., quantization_config=GGUFQuantizationConfig(...))`` on a GGUF file the test wrote.
    The other order: a patched model's saved folder is the unpatched one's, file for file."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel

    def load():
        return WanTransformer3DModel.from_single_file(
            str(wan_gguf / "wan.gguf"), config=str(wan_gguf), torch_dtype=torch.bfloat16,
            quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16))

    twin, model = load(), load()
    assert any(type(m).__name__ == "GGUFLinear" for m in model.modules())
    wan_inputs = W.inputs("wan")
    expected = W.forward(twin, wan_inputs)
    before = W.weights(model)
    W.apply(model)
    assert W.weights(model) == before
    assert torch.equal(W.forward(model, wan_inputs), expected)
    accelpatch.remove(model)
    assert torch.equal(W.forward(model, wan_inputs), expected)
    assert W.weights(model) == before
    if order == "apply_then_tool":
        plain = W.build("wan", {**WAN_TINY_CONFIG, "attention_head_dim": 16, "ffn_dim": 64})
        W.apply(plain)
        assert W.saved_files(plain, tmp_path / "a") == W.saved_files(
            W.build("wan", {**WAN_TINY_CONFIG, "attention_head_dim": 16, "ffn_dim": 64}), tmp_path / "b")


# -- memory: layerwise casting, group offloading, model CPU offload ---------------------------------------------------

MEMORY = {
    "layerwise_casting": W.layerwise_casting,
    "group_offload_block_level": W.group_offload("block_level"),
    "group_offload_leaf_level": W.group_offload("leaf_level"),
    "enable_group_offload": W.enable_group_offload,
}
#: the tools that hook each Linear (the fused linear op runs the hooked layer itself, counted)
HOOKS_EACH_LINEAR = {"layerwise_casting", "group_offload_leaf_level"}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["sana_video", "sana_video2", "wan"])
@pytest.mark.parametrize("tool", sorted(MEMORY))
def test_casting_and_offloading(tool, family, order):
    op = LINEAR_OP[family]
    check = None
    if tool in HOOKS_EACH_LINEAR and op is not None:
        calls = {"sana_video": 8, "sana_video2": 12}[family]
        check = lambda m: W.assert_ran_itself(m, op, calls, ("hook",), hooked=True)  # noqa: E731
    _check(family, MEMORY[tool], order, report_check=check)


@pytest.fixture(scope="module")
def sana_pipeline_frames():
    return tiny_sana_video_pipeline(dtype=torch.bfloat16)(**sana_video_pipeline_call_kwargs()).frames


def _frames(pipe):
    return pipe(**sana_video_pipeline_call_kwargs()).frames


@pytest.mark.parametrize("order", ORDERS)
def test_model_cpu_offload(sana_pipeline_frames, order):
    """accelerate's model CPU offload hooks the transformer itself; ``device="cpu"`` runs it on a CPU-only box."""
    pipe = tiny_sana_video_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        pipe.enable_model_cpu_offload(device="cpu")
        W.apply(pipe)
    else:
        W.apply(pipe)
        pipe.enable_model_cpu_offload(device="cpu")
    assert torch.equal(_frames(pipe), sana_pipeline_frames)
    accelpatch.remove(pipe)
    assert torch.equal(_frames(pipe), sana_pipeline_frames)


@pytest.mark.skipif(torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available()),
                    reason="an accelerator is present")
def test_model_cpu_offload_needs_an_accelerator_patched_or_not():
    """Without an accelerator diffusers refuses ``enable_model_cpu_offload()`` (no device argument), the same with
    accelpatch."""
    for patched in (False, True):
        pipe = tiny_sana_video_pipeline(dtype=torch.bfloat16)
        if patched:
            W.apply(pipe)
        with pytest.raises(RuntimeError, match="requires accelerator"):
            pipe.enable_model_cpu_offload()
        accelpatch.remove(pipe)


# -- LoRA (PEFT) -------------------------------------------------------------------------------------------------

SANA_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _lora_state(seed):
    peft = W.need("peft")
    from peft.utils import get_peft_model_state_dict

    model = W.build("sana_video")
    torch.manual_seed(seed)
    model.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=SANA_LORA_TARGETS, init_lora_weights=False))
    return get_peft_model_state_dict(model)


@pytest.fixture(scope="module")
def lora_folders(tmp_path_factory):
    from diffusers import SanaVideoPipeline

    folders = []
    for seed in (1, 2):
        folder = tmp_path_factory.mktemp(f"lora{seed}")
        SanaVideoPipeline.save_lora_weights(folder, transformer_lora_layers=_lora_state(seed))
        folders.append(folder)
    return folders


def _sana_linear_calls_ran_lora_layers(pipe, calls):
    W.assert_ran_itself(pipe.transformer, "linear", calls, ("peft", "lora", "LoRA"))


@pytest.mark.parametrize("order", ORDERS)
def test_load_lora_weights(lora_folders, order):
    twin = tiny_sana_video_pipeline(dtype=torch.bfloat16)
    twin.load_lora_weights(lora_folders[0], adapter_name="a")
    expected = _frames(twin)
    pipe = tiny_sana_video_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        pipe.load_lora_weights(lora_folders[0], adapter_name="a")
        W.apply(pipe)
    else:
        W.apply(pipe)
        pipe.load_lora_weights(lora_folders[0], adapter_name="a")
    assert W.weights(pipe.transformer) == W.weights(twin.transformer)
    assert torch.equal(_frames(pipe), expected)
    _sana_linear_calls_ran_lora_layers(pipe, 2 * 2 * 4)  # 2 steps x 2 blocks x 4 projections (CFG batched)
    accelpatch.remove(pipe)
    assert torch.equal(_frames(pipe), expected)
    W.assert_unpatched(pipe.transformer)


def test_set_adapters_fuse_unfuse_and_hotswap(lora_folders):
    """set_adapters, fuse_lora/unfuse_lora and a hot-swapped adapter, on a pipeline patched in between: each output
    equals the unpatched pipeline's after the same steps."""
    def steps(pipe, patch):
        pipe.enable_lora_hotswap(target_rank=8)
        pipe.load_lora_weights(lora_folders[0], adapter_name="a")
        if patch:
            W.apply(pipe)
        out = []
        pipe.set_adapters(["a"], [0.5])
        out.append(_frames(pipe))
        pipe.fuse_lora(lora_scale=1.0)
        out.append(_frames(pipe))
        pipe.unfuse_lora()
        pipe.set_adapters(["a"], [1.0])
        pipe.load_lora_weights(lora_folders[1], adapter_name="a", hotswap=True)
        out.append(_frames(pipe))
        out.append(W.weights(pipe.transformer))
        return out

    twin = tiny_sana_video_pipeline(dtype=torch.bfloat16)
    expected = steps(twin, patch=False)
    pipe = tiny_sana_video_pipeline(dtype=torch.bfloat16)
    got = steps(pipe, patch=True)
    assert all(torch.equal(a, b) for a, b in zip(got[:3], expected[:3]))
    assert got[3] == expected[3]
    accelpatch.remove(pipe)
    assert torch.equal(_frames(pipe), expected[2])


@pytest.mark.parametrize("order", ORDERS)
def test_add_adapter_to_a_transformer(order):
    peft = W.need("peft")

    def add(model):
        torch.manual_seed(3)
        model.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                          init_lora_weights=False))
    _check("wan", add, order)
    _check("sana_video", add, order,
           report_check=lambda m: W.assert_ran_itself(m, "linear", 8, ("peft", "lora", "LoRA")))


@pytest.mark.parametrize("tool", ["quanto", "lora"])
def test_the_report_names_the_class_of_a_layer_that_runs_itself(tool):
    peft = W.need("peft")
    W.need("optimum.quanto")
    model = W.build("minimax_h3")
    if tool == "quanto":
        W.quanto_int8(model)
        name = "QLinear"
    else:
        model.add_adapter(peft.LoraConfig(r=4, target_modules=["to_q"], init_lora_weights=False))
        name = "peft"
    W.apply(model)
    W.forward(model, "minimax_h3")
    assert any(name in reason for reason in W.op_outcomes(model, "linear"))


# -- save_pretrained ---------------------------------------------------------------------------------------------

def _lora_on_to_q(model):
    peft = W.need("peft")
    torch.manual_seed(3)
    model.add_adapter(peft.LoraConfig(r=4, target_modules=["to_q"], init_lora_weights=False))


#: tool -> (family, the tool, model config, save_pretrained arguments)
SAVED = {
    "torchao": ("sana_video", W.torchao("Int8WeightOnlyConfig"), None, {"safe_serialization": False}),
    "quanto": ("minimax_h3", W.quanto_int8, None, {}),
    "gguf": ("sana_video", W.gguf_q8_0, "rows_of_32", {}),
    "lora": ("sana_video", _lora_on_to_q, None, {}),
    "layerwise_casting": ("sana_video", MEMORY["layerwise_casting"], None, {}),
    "group_offload_leaf_level": ("sana_video", MEMORY["group_offload_leaf_level"], None, {}),
}


@pytest.mark.parametrize("tool", sorted(SAVED))
def test_saved_files_unchanged(tmp_path, tool):
    """``save_pretrained`` of a patched model that ran writes the unpatched model's files, byte for byte."""
    family, apply_tool, config, save = SAVED[tool]
    config = _sana_config(SANA_ROWS_OF_32) if config == "rows_of_32" else None
    twin, model = W.build(family, config), W.build(family, config)
    apply_tool(twin)
    apply_tool(model)
    W.apply(model)
    W.forward(model, family)
    assert W.saved_files(model, tmp_path / "patched", **save) == W.saved_files(twin, tmp_path / "twin", **save)
    accelpatch.remove(model)


# -- attention backends ------------------------------------------------------------------------------------------

@pytest.fixture
def restore_attention_backend():
    import diffusers.models.attention_dispatch as dispatch

    previous = dispatch._AttentionBackendRegistry._active_backend
    yield
    dispatch._AttentionBackendRegistry._active_backend = previous  # set_attention_backend sets the global too


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["sana_video", "wan"])
@pytest.mark.parametrize("backend", ["native", "_native_math"])
def test_set_attention_backend(restore_attention_backend, backend, family, order):
    _check(family, lambda m: m.set_attention_backend(backend), order)


# -- diffusers' own step caches ----------------------------------------------------------------------------------

def _cache_config(kind, steps=4):
    from diffusers import FirstBlockCacheConfig, MagCacheConfig

    if kind == "first_block":
        return FirstBlockCacheConfig(threshold=0.5)
    return MagCacheConfig(mag_ratios=[1.0] * steps, num_inference_steps=steps, threshold=0.5)


def _wan_small():
    return wan_pipeline_call_kwargs(num_inference_steps=4, height=32, width=32, num_frames=5)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind", ["first_block", "mag"])
def test_diffusers_enable_cache_on_wan(kind, order):
    """diffusers' FirstBlockCache and MagCache on Wan, before and after apply(): the unpatched model's outputs. (After
    apply() it failed: "GatedWanTransformerBlock not registered".) remove() leaves diffusers' registry as it was."""
    twin = tiny_wan_pipeline(dtype=torch.bfloat16)
    twin.transformer.enable_cache(_cache_config(kind))
    expected = twin(**_wan_small()).frames
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        pipe.transformer.enable_cache(_cache_config(kind))
        W.apply(pipe)
    else:
        W.apply(pipe)
        pipe.transformer.enable_cache(_cache_config(kind))
    assert torch.equal(pipe(**_wan_small()).frames, expected)
    accelpatch.remove(pipe)
    W.assert_unpatched(pipe.transformer)
    assert torch.equal(pipe(**_wan_small()).frames, expected)
    pipe.transformer.disable_cache()
    twin.transformer.disable_cache()
    assert torch.equal(pipe(**_wan_small()).frames, twin(**_wan_small()).frames)


def test_a_copy_holds_its_own_registry_entries():
    """A deep copy of a patched Wan holds its gated block class in diffusers' registry on its own: diffusers'
    FirstBlockCache still takes the copy after the original's remove(), and the entry goes with the copy's."""
    import copy

    model = W.build("wan")
    W.apply(model)
    twin = copy.deepcopy(model)
    accelpatch.remove(model)
    twin.enable_cache(_cache_config("first_block"))
    with twin.cache_context("cond"):
        W.forward(twin, "wan")
    twin.disable_cache()
    accelpatch.remove(twin)
    W.assert_unpatched(twin, like=model)


def test_diffusers_first_block_cache_on_sana_video_is_refused_alike():
    """diffusers registers no SANA-Video block: its FirstBlockCache refuses the unpatched model, and the patched one,
    also after accelpatch's own cache came and went (which once registered the class for the rest of the process)."""
    from diffusers.hooks import apply_first_block_cache

    from accelpatch.core import block_registry
    from diffusers.models.transformers.transformer_sana_video import SanaVideoTransformerBlock

    def attempt(patch):
        model = W.build("sana_video")
        patch(model)
        with pytest.raises(ValueError, match="not registered"):
            apply_first_block_cache(model, _cache_config("first_block"))

    def came_and_went(model):
        W.apply(model, cache="first_block")
        accelpatch.remove(model)

    if block_registry.entry(SanaVideoTransformerBlock) is not None:
        # another live model of this process (one a failed test's traceback keeps, say) carries accelpatch's step
        # cache: it holds the block's entry, and so diffusers' cache takes SANA-Video models while it lives
        assert block_registry.is_ours(SanaVideoTransformerBlock)
        assert W.held_entries(collect=True).get(SanaVideoTransformerBlock)
        return
    attempt(lambda m: None)
    attempt(came_and_went)
    attempt(W.apply)


@pytest.mark.parametrize("how", ["enable_cache", "hooks"])
@pytest.mark.parametrize("kind", ["first_block", "mag"])
def test_apply_cache_on_a_model_with_diffusers_cache_is_refused(kind, how):
    """accelpatch's step cache on a model that carries diffusers' own (through ``enable_cache``, or its hooks put on
    the blocks directly): refused, saying what to do instead (not diffusers' "hook fbc_leader_block_hook already
    exists", and not a silently replaced MagCache). Nothing is patched."""
    from diffusers.hooks import apply_first_block_cache, apply_mag_cache

    model = W.build("wan")
    if how == "enable_cache":
        model.enable_cache(_cache_config(kind))
        advice = r"disable_cache\(\).*as apply\(\.\.\., cache=\.\.\.\) instead"
    else:
        (apply_first_block_cache if kind == "first_block" else apply_mag_cache)(model, _cache_config(kind))
        advice = r"remove_hook.*as apply\(\.\.\., cache=\.\.\.\)"
    with pytest.raises(CacheConflictError, match=advice):
        W.apply(model, cache=_cache_config(kind))
    assert "_accelpatch_state" not in model.__dict__
    W.assert_unpatched(model)


def test_diffusers_enable_cache_after_apply_cache_is_refused_by_diffusers():
    """While accelpatch's step cache is on, the model says so (``is_cache_enabled``): diffusers' enable_cache()
    refuses to stack its own; after remove() it works as on an unpatched model."""
    model = W.build("wan")
    W.apply(model, cache="first_block")
    assert model.is_cache_enabled
    for kind in ("first_block", "mag"):
        with pytest.raises(ValueError, match="StepCacheConfig"):
            model.enable_cache(_cache_config(kind))
    accelpatch.remove(model)
    assert not model.is_cache_enabled
    model.enable_cache(_cache_config("first_block"))
    model.disable_cache()


# -- cache-dit ---------------------------------------------------------------------------------------------------

def _cache_dit_config():
    cache_dit = W.need("cache_dit")
    return cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=1,
                                   residual_diff_threshold=0.5)


@pytest.fixture(scope="module")
def cache_dit_frames():
    cache_dit = W.need("cache_dit")
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    cache_dit.enable_cache(pipe, cache_config=_cache_dit_config())
    frames = pipe(**_wan_small()).frames
    assert cache_dit.summary(pipe)[0].cached_steps  # cache-dit skipped blocks on some steps
    return frames


@pytest.mark.parametrize("order", ORDERS)
def test_cache_dit_with_the_default_tier(cache_dit_frames, order):
    """cache-dit's DBCache on Wan, with accelpatch's lossless paths under it: cache-dit's own outputs."""
    cache_dit = W.need("cache_dit")
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        cache_dit.enable_cache(pipe, cache_config=_cache_dit_config())
        W.apply(pipe)
    else:
        W.apply(pipe)
        cache_dit.enable_cache(pipe, cache_config=_cache_dit_config())
    assert torch.equal(pipe(**_wan_small()).frames, cache_dit_frames)
    accelpatch.remove(pipe)
    assert torch.equal(pipe(**_wan_small()).frames, cache_dit_frames)
    cache_dit.disable_cache(pipe)


@pytest.mark.parametrize("order", ORDERS)
def test_cache_dit_and_the_step_cache_are_refused_together(order):
    """Two step caches on one model: apply(cache=...) refuses cache-dit's, and a model that got cache-dit after
    apply(cache=...) refuses its next call, each saying which to drop."""
    cache_dit = W.need("cache_dit")
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    drop = r"cache_dit\.disable_cache\(pipe\).*without cache="
    if order == "tool_then_apply":
        cache_dit.enable_cache(pipe, cache_config=_cache_dit_config())
        with pytest.raises(CacheConflictError, match=drop):
            W.apply(pipe, cache="first_block")
        assert "_accelpatch_state" not in pipe.transformer.__dict__
    else:
        W.apply(pipe, cache="first_block")
        cache_dit.enable_cache(pipe, cache_config=_cache_dit_config())
        with pytest.raises(CacheConflictError, match=drop):
            pipe(**_wan_small())
        accelpatch.remove(pipe)
    cache_dit.disable_cache(pipe)
    W.apply(pipe, cache="first_block")  # with cache-dit gone, accelpatch's cache runs
    pipe(**_wan_small())
    accelpatch.remove(pipe)

"""accelpatch with the tools people put on big video models, each before ``apply()`` and after it, on tiny bf16
models: quantization (torchao, diffusers' TorchAoConfig, optimum-quanto, GGUF), memory (layerwise casting, group
offloading, model CPU offload), LoRA (PEFT), caches (diffusers' FirstBlockCache and MagCache, cache-dit) and
attention backends.

Every combination: at the default tier the output is ``torch.equal`` to the same model with the same tool and no
accelpatch; ``remove()`` gives those bits back; the weights (SHA-256 of the plain tensors behind every state-dict
entry) and ``save_pretrained``'s files never change. Two step caches on one model are refused, by name.

Each combination first runs without accelpatch in a subprocess (``_works_with_tools.probe_unpatched``, all of them
before the first test): where a tool crashes, hangs or raises by itself on this CPU (optimum-quanto's int8 matmul on
an AVX-512 CPU with avx512_bf16: SIGSEGV), its tests are skipped naming the tool and the cause; a crash with
accelpatch applied where the unpatched run did not crash stays a failure.
"""
from __future__ import annotations

import pytest
import torch

import accelpatch
from accelpatch.core.errors import CacheConflictError
from accelpatch.testing import (WAN_TINY_CONFIG, sana_video_pipeline_call_kwargs, tiny_sana_video_pipeline,
                                tiny_wan_pipeline)

import _works_with_tools as W

ORDERS = ("tool_then_apply", "apply_then_tool")


@pytest.fixture(scope="module", autouse=True)
def _every_combination_runs_unpatched_first():
    """Every combination below, once without accelpatch, before the first test: one subprocess for all of them (and
    one more after each crash), instead of one per test."""
    W.probe_unpatched(_combinations())


def _combinations() -> list[str]:
    sana_32 = _sana_config(SANA_ROWS_OF_32)
    keys = [W.probe_key(f, W.torchao(c)) for c in TORCHAO for f in ("sana_video", "sana_video2", "wan")]
    keys += [W.probe_key(f, W.quanto_int8) for f in ("minimax_h3", "wan")]
    keys += [W.probe_key("sana_video", W.gguf_q8_0, sana_32)]
    keys += [W.probe_key(f, tool) for tool in MEMORY.values() for f in ("sana_video", "sana_video2", "wan")]
    keys += [W.probe_key(f, SANA_LORA) for f in ("sana_video", "wan")]
    keys += [W.probe_key(f, W.attention_backend(b)) for b in ("native", "_native_math") for f in ("sana_video", "wan")]
    keys += [W.probe_key(family, tool, sana_32 if config == "rows_of_32" else None)
             for family, tool, config, _ in SAVED.values()]
    keys += [W.probe_key("sana_video_pipeline", W.model_cpu_offload), W.probe_key("wan_pipeline", W.cache_dit)]
    keys += [W.probe_key("wan_pipeline", W.diffusers_cache(kind)) for kind in ("first_block", "mag")]
    return keys


def _check(family, tool, order, *, config=None):
    """The contract for ``tool`` on ``family``'s tiny bf16 model in ``order``; returns the patched model (removed)."""
    W.skip_unless_unpatched_runs(W.probe_key(family, tool, config))
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
    accelpatch.remove(model)
    W.assert_unpatched(model)
    assert torch.equal(W.forward(model, family), expected)
    assert W.weights(model) == expected_weights
    return model


# -- quantization ------------------------------------------------------------------------------------------------

TORCHAO = ("Int8WeightOnlyConfig", "Float8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["sana_video", "sana_video2", "wan"])
@pytest.mark.parametrize("config", TORCHAO)
def test_torchao_quantize(config, family, order):
    """torchao's tensor-subclass weights (the layers stay nn.Linear)."""
    _check(family, W.torchao(config), order)


def test_sana_video2_runs_quantized_weights_unpatched_and_patched():
    """SANA-Video 2.0 used to fail under torchao even unpatched (its Attention Residual read a Linear's weight:
    ``Int8Tensor dispatch: ... aten.unsqueeze``); its plain weights keep the einsum and its numbers."""
    from accelpatch.models.sana_video2.modeling.attention_residual import BlockAttentionResidual

    projection = torch.nn.Linear(32, 1, bias=False).to(torch.bfloat16)
    keys = torch.randn(3, 2, 40, 32, dtype=torch.bfloat16)
    plain = BlockAttentionResidual.logits(projection, keys)
    assert torch.equal(plain, torch.einsum("d,nbtd->nbt", projection.weight[0], keys))
    calls = []
    projection.register_forward_hook(lambda *a: calls.append(1))  # hooked: called, as diffusers calls its layers
    assert torch.equal(BlockAttentionResidual.logits(projection, keys), projection(keys).squeeze(-1)) and calls
    W.need("torchao")
    W.skip_unless_unpatched_runs(W.probe_key("sana_video2", W.torchao("Int8WeightOnlyConfig")))
    model = W.build("sana_video2")
    W.torchao("Int8WeightOnlyConfig")(model)
    assert type(model.attn_res.attn_proj.weight).__name__ == "Int8Tensor"
    assert torch.isfinite(W.forward(model, "sana_video2")).all()


@pytest.mark.parametrize("order", ORDERS)
def test_torchao_config_from_pretrained(tmp_path, order):
    """diffusers' TorchAoConfig quantizes at load. The other order: a patched model's saved folder loads into the
    same quantized model as the unpatched one's."""
    W.need("torchao")
    W.skip_unless_unpatched_runs(W.probe_key("sana_video", W.torchao("Int8WeightOnlyConfig")))  # the same kernels
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
    assert W.saved_files(model, tmp_path / "q", safe_serialization=False) == W.saved_files(
        twin, tmp_path / "q_twin", safe_serialization=False)
    accelpatch.remove(model)
    assert torch.equal(W.forward(model, "sana_video"), expected)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["minimax_h3", "wan"])
def test_quanto_qint8(family, order):
    """optimum-quanto swaps each Linear for its QLinear. (SANA-Video in bf16 fails unpatched inside quanto: its CPU
    int8 kernel needs contiguous rows, and SANA's to_out input is not.)"""
    W.need("optimum.quanto")
    _check(family, W.quanto_int8, order)


@pytest.mark.parametrize("order", ORDERS)
def test_gguf_linear_layers_sana_video(order):
    """GGUF Q8_0 weights as diffusers' GGUF loader leaves them (GGUFLinear, GGUFParameter), built with diffusers'
    own helper: diffusers has no single-file mapping for SanaVideoTransformer3DModel."""
    _check("sana_video", W.gguf_q8_0, order, config=_sana_config(SANA_ROWS_OF_32))


#: SANA-Video's tiny config with 32-wide attention rows (Q8_0 quantizes blocks of 32 values)
SANA_ROWS_OF_32 = {"num_attention_heads": 2, "attention_head_dim": 16, "cross_attention_dim": 32}


def _sana_config(overrides):
    from accelpatch.testing import SANA_VIDEO_TINY_CONFIG

    return {**SANA_VIDEO_TINY_CONFIG, **overrides}


#: Wan's tiny config with 32-wide rows (Q8_0 blocks)
WAN_ROWS_OF_32 = {**WAN_TINY_CONFIG, "attention_head_dim": 16, "ffn_dim": 64}


@pytest.fixture(scope="module")
def wan_gguf(tmp_path_factory):
    """A tiny Wan checkpoint as one GGUF file (Q8_0 Linears) and its config folder."""
    W.need("gguf")
    folder = tmp_path_factory.mktemp("wan_gguf")
    source = W.build("wan", WAN_ROWS_OF_32)
    source.save_config(folder)
    W.write_gguf_checkpoint(source, folder / "wan.gguf")
    return folder


@pytest.mark.parametrize("order", ORDERS)
def test_gguf_from_single_file_wan(wan_gguf, tmp_path, order):
    """``from_single_file(..., quantization_config=GGUFQuantizationConfig(...))`` on a GGUF file the test wrote.
    The other order: a patched model's saved folder is the unpatched one's, file for file."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel

    # the probe: diffusers' GGUF layers and their Q8_0 dequantization, on the model they can be put on directly
    W.skip_unless_unpatched_runs(W.probe_key("sana_video", W.gguf_q8_0, _sana_config(SANA_ROWS_OF_32)))

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
        plain = W.build("wan", WAN_ROWS_OF_32)
        W.apply(plain)
        assert W.saved_files(plain, tmp_path / "a") == W.saved_files(W.build("wan", WAN_ROWS_OF_32), tmp_path / "b")


# -- memory: layerwise casting, group offloading, model CPU offload ---------------------------------------------------

MEMORY = {
    "layerwise_casting": W.layerwise_casting,
    "group_offload_block_level": W.group_offload("block_level"),
    "group_offload_leaf_level": W.group_offload("leaf_level"),
    "enable_group_offload": W.enable_group_offload,
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("family", ["sana_video", "sana_video2", "wan"])
@pytest.mark.parametrize("tool", sorted(MEMORY))
def test_casting_and_offloading(tool, family, order):
    _check(family, MEMORY[tool], order)


@pytest.fixture(scope="module")
def sana_pipeline_frames():
    return tiny_sana_video_pipeline(dtype=torch.bfloat16)(**sana_video_pipeline_call_kwargs()).frames


def _frames(pipe):
    return pipe(**sana_video_pipeline_call_kwargs()).frames


@pytest.mark.parametrize("order", ORDERS)
def test_model_cpu_offload(sana_pipeline_frames, order):
    """accelerate's model CPU offload hooks the transformer itself; ``device="cpu"`` runs it on a CPU-only box."""
    W.skip_unless_unpatched_runs(W.probe_key("sana_video_pipeline", W.model_cpu_offload))
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


#: what the LoRA tests run: PEFT's LoRA layers on SANA-Video's projections (the probe puts them on the transformer)
SANA_LORA = W.lora_adapter(*SANA_LORA_TARGETS)


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


@pytest.mark.parametrize("order", ORDERS)
def test_load_lora_weights(lora_folders, order):
    W.skip_unless_unpatched_runs(W.probe_key("sana_video", SANA_LORA))
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
    accelpatch.remove(pipe)
    assert torch.equal(_frames(pipe), expected)
    W.assert_unpatched(pipe.transformer)


def test_set_adapters_fuse_unfuse_and_hotswap(lora_folders):
    """set_adapters, fuse_lora/unfuse_lora and a hot-swapped adapter, on a pipeline patched in between: each output
    equals the unpatched pipeline's after the same steps."""
    W.skip_unless_unpatched_runs(W.probe_key("sana_video", SANA_LORA))
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
    W.need("peft")
    _check("wan", SANA_LORA, order)  # Wan's attention projections have the same names
    _check("sana_video", SANA_LORA, order)


# -- save_pretrained ---------------------------------------------------------------------------------------------

#: tool -> (family, the tool, model config, save_pretrained arguments)
SAVED = {
    "torchao": ("sana_video", W.torchao("Int8WeightOnlyConfig"), None, {"safe_serialization": False}),
    "quanto": ("minimax_h3", W.quanto_int8, None, {}),
    "gguf": ("sana_video", W.gguf_q8_0, "rows_of_32", {}),
    "lora": ("sana_video", W.lora_adapter("to_q"), None, {}),
    "layerwise_casting": ("sana_video", MEMORY["layerwise_casting"], None, {}),
    "group_offload_leaf_level": ("sana_video", MEMORY["group_offload_leaf_level"], None, {}),
}


@pytest.mark.parametrize("tool", sorted(SAVED))
def test_saved_files_unchanged(tmp_path, tool):
    """``save_pretrained`` of a patched model that ran writes the unpatched model's files, byte for byte."""
    family, apply_tool, config, save = SAVED[tool]
    config = _sana_config(SANA_ROWS_OF_32) if config == "rows_of_32" else None
    W.skip_unless_unpatched_runs(W.probe_key(family, apply_tool, config))
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
    _check(family, W.attention_backend(backend), order)


# -- diffusers' own step caches ----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind", ["first_block", "mag"])
def test_diffusers_enable_cache_on_wan(kind, order):
    """diffusers' FirstBlockCache and MagCache on Wan, before and after apply(): the unpatched model's outputs. (After
    apply() it failed: "GatedWanTransformerBlock not registered".) remove() leaves diffusers' registry as it was."""
    W.skip_unless_unpatched_runs(W.probe_key("wan_pipeline", W.diffusers_cache(kind)))
    twin = tiny_wan_pipeline(dtype=torch.bfloat16)
    twin.transformer.enable_cache(W.diffusers_cache_config(kind))
    expected = twin(**W.PIPELINE_CALLS["wan"]()).frames
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        pipe.transformer.enable_cache(W.diffusers_cache_config(kind))
        W.apply(pipe)
    else:
        W.apply(pipe)
        pipe.transformer.enable_cache(W.diffusers_cache_config(kind))
    assert torch.equal(pipe(**W.PIPELINE_CALLS["wan"]()).frames, expected)
    accelpatch.remove(pipe)
    W.assert_unpatched(pipe.transformer)
    assert torch.equal(pipe(**W.PIPELINE_CALLS["wan"]()).frames, expected)
    pipe.transformer.disable_cache()
    twin.transformer.disable_cache()
    assert torch.equal(pipe(**W.PIPELINE_CALLS["wan"]()).frames, twin(**W.PIPELINE_CALLS["wan"]()).frames)


def test_a_copy_holds_its_own_registry_entries():
    """A deep copy of a patched Wan holds its gated block class in diffusers' registry on its own: diffusers'
    FirstBlockCache still takes the copy after the original's remove(), and the entry goes with the copy's."""
    import copy

    model = W.build("wan")
    W.apply(model)
    twin = copy.deepcopy(model)
    accelpatch.remove(model)
    twin.enable_cache(W.diffusers_cache_config("first_block"))
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
            apply_first_block_cache(model, W.diffusers_cache_config("first_block"))

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
        model.enable_cache(W.diffusers_cache_config(kind))
        advice = r"disable_cache\(\).*as apply\(\.\.\., cache=\.\.\.\) instead"
    else:
        (apply_first_block_cache if kind == "first_block" else apply_mag_cache)(model, W.diffusers_cache_config(kind))
        advice = r"remove_hook.*as apply\(\.\.\., cache=\.\.\.\)"
    with pytest.raises(CacheConflictError, match=advice):
        W.apply(model, cache=W.diffusers_cache_config(kind))
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
            model.enable_cache(W.diffusers_cache_config(kind))
    accelpatch.remove(model)
    assert not model.is_cache_enabled
    model.enable_cache(W.diffusers_cache_config("first_block"))
    model.disable_cache()


# -- cache-dit ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_dit_frames():
    cache_dit = W.need("cache_dit")
    W.skip_unless_unpatched_runs(W.probe_key("wan_pipeline", W.cache_dit))
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    cache_dit.enable_cache(pipe, cache_config=W.cache_dit_config())
    frames = pipe(**W.PIPELINE_CALLS["wan"]()).frames
    assert cache_dit.summary(pipe)[0].cached_steps  # cache-dit skipped blocks on some steps
    return frames


@pytest.mark.parametrize("order", ORDERS)
def test_cache_dit_with_the_default_tier(cache_dit_frames, order):
    """cache-dit's DBCache on Wan, with accelpatch's lossless paths under it: cache-dit's own outputs."""
    cache_dit = W.need("cache_dit")
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    if order == "tool_then_apply":
        cache_dit.enable_cache(pipe, cache_config=W.cache_dit_config())
        W.apply(pipe)
    else:
        W.apply(pipe)
        cache_dit.enable_cache(pipe, cache_config=W.cache_dit_config())
    assert torch.equal(pipe(**W.PIPELINE_CALLS["wan"]()).frames, cache_dit_frames)
    accelpatch.remove(pipe)
    assert torch.equal(pipe(**W.PIPELINE_CALLS["wan"]()).frames, cache_dit_frames)
    cache_dit.disable_cache(pipe)


@pytest.mark.parametrize("order", ORDERS)
def test_cache_dit_and_the_step_cache_are_refused_together(order):
    """Two step caches on one model: apply(cache=...) refuses cache-dit's, and a model that got cache-dit after
    apply(cache=...) refuses its next call, each saying which to drop."""
    cache_dit = W.need("cache_dit")
    pipe = tiny_wan_pipeline(dtype=torch.bfloat16)
    drop = r"cache_dit\.disable_cache\(pipe\).*without cache="
    if order == "tool_then_apply":
        cache_dit.enable_cache(pipe, cache_config=W.cache_dit_config())
        with pytest.raises(CacheConflictError, match=drop):
            W.apply(pipe, cache="first_block")
        assert "_accelpatch_state" not in pipe.transformer.__dict__
    else:
        W.apply(pipe, cache="first_block")
        cache_dit.enable_cache(pipe, cache_config=W.cache_dit_config())
        with pytest.raises(CacheConflictError, match=drop):
            pipe(**W.PIPELINE_CALLS["wan"]())
        accelpatch.remove(pipe)
    cache_dit.disable_cache(pipe)
    W.apply(pipe, cache="first_block")  # with cache-dit gone, accelpatch's cache runs
    pipe(**W.PIPELINE_CALLS["wan"]())
    accelpatch.remove(pipe)

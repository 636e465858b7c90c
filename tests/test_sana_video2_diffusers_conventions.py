"""The tiny SANA-Video 2.0 transformer against diffusers' model conventions.

diffusers' generic model tests (``tests/models/testing_utils`` in its repository: common, compile, memory, training,
cache) are not shipped in its wheel, so these are our own restatements of their checks, wherever their assumptions
hold for this model, on the CPU. Where they do not hold (LoRA target names, diffusers' block caches, fused QKV
projections, accelerator-only checks), the section "SANA-Video 2.0 and diffusers' model conventions" of
docs/models/sana-video2.md says why.
"""
import copy
import pickle
import re

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from torch._dynamo.testing import CompileCounter

from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel
from accelpatch.testing.sana_video2 import sana_video2_transformer_inputs, tiny_sana_video2_transformer


@pytest.fixture(scope="module")
def model():
    return tiny_sana_video2_transformer()


@pytest.fixture(scope="module")
def inputs(model):
    return sana_video2_transformer_inputs(model)


@pytest.fixture(scope="module")
def reference(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run(model, inputs, **kwargs):
    with torch.no_grad():
        return model(**inputs, **kwargs)


def owned(model):
    """``model`` with every tensor moved out of from_pretrained's safetensors file mapping (whose 8-byte aligned
    operands some CPU kernels round differently), so that outputs compare bit for bit."""
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.data = tensor.data.clone()
    return model


# -- common: save/load, determinism, outputs --------------------------------------------------------------------


@pytest.mark.parametrize("variant", [None, "fp16"])
def test_save_pretrained_round_trip(model, inputs, reference, tmp_path, variant):
    model.save_pretrained(tmp_path, variant=variant)
    loaded = SanaVideo2Transformer3DModel.from_pretrained(tmp_path, variant=variant)
    public = lambda config: {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()  # noqa: E731
                             if not k.startswith("_")}  # JSON keeps tuples as lists
    assert public(loaded.config) == public(model.config)
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())
    assert torch.equal(run(owned(loaded), inputs).sample, reference)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("low_cpu_mem_usage", [True, False])
def test_from_pretrained_torch_dtype(model, tmp_path, dtype, low_cpu_mem_usage):
    copy.deepcopy(model).to(dtype).save_pretrained(tmp_path)
    loaded = SanaVideo2Transformer3DModel.from_pretrained(tmp_path, torch_dtype=dtype,
                                                          low_cpu_mem_usage=low_cpu_mem_usage)
    assert loaded.dtype == dtype


def test_sharded_save_pretrained_loads(model, inputs, reference, tmp_path):
    model.save_pretrained(tmp_path, max_shard_size="300KB")
    assert (tmp_path / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert torch.equal(run(owned(SanaVideo2Transformer3DModel.from_pretrained(tmp_path)), inputs).sample, reference)


def test_determinism_output_shape_and_tuple_output(model, inputs, reference):
    assert torch.equal(run(model, inputs).sample, reference)
    assert reference.shape == inputs["hidden_states"].shape
    as_tuple = run(model, inputs, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 1 and torch.equal(as_tuple[0], reference)


def test_from_config_builds_the_same_architecture(model):
    rebuilt = SanaVideo2Transformer3DModel.from_config(model.config)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


def test_class_attributes_name_what_the_model_has(model):
    classes = {type(module).__name__ for module in model.modules()}
    names = [name for name, _ in model.named_modules()]
    assert set(model._no_split_modules) <= classes and set(model._repeated_blocks) <= classes
    for pattern in model._skip_layerwise_casting_patterns:  # no stale pattern
        assert any(re.search(pattern, name) for name in names), pattern


def test_copies_and_dtype_moves(model, inputs, reference):
    assert torch.equal(run(copy.deepcopy(model), inputs).sample, reference)
    assert torch.equal(run(pickle.loads(pickle.dumps(model)), inputs).sample, reference)  # RoPE tables rebuilt
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert half.dtype == torch.bfloat16
    out = run(half, {**inputs, "hidden_states": inputs["hidden_states"].bfloat16(),
                     "encoder_hidden_states": inputs["encoder_hidden_states"].bfloat16()}).sample
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# -- memory: layerwise casting -----------------------------------------------------------------------------------


@pytest.mark.parametrize("storage_dtype,compute_dtype", [
    (torch.bfloat16, torch.float32), (torch.float8_e4m3fn, torch.float32), (torch.float8_e5m2, torch.float32),
    (torch.float8_e4m3fn, torch.bfloat16)])
def test_layerwise_casting(reference, storage_dtype, compute_dtype):
    from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    model = tiny_sana_video2_transformer().to(compute_dtype)
    model.enable_layerwise_casting(storage_dtype=storage_dtype, compute_dtype=compute_dtype)
    skipped = (*DEFAULT_SKIP_MODULES_PATTERN, *model._skip_layerwise_casting_patterns)
    for name, module in model.named_modules():
        if isinstance(module, _GO_LC_SUPPORTED_PYTORCH_LAYERS):
            stored = compute_dtype if any(re.search(pattern, name) for pattern in skipped) else storage_dtype
            assert {p.dtype for p in module.parameters(recurse=False)} == {stored}, name
    assert model.dtype == compute_dtype
    out = run(model, sana_video2_transformer_inputs(model, dtype=compute_dtype)).sample
    assert out.dtype == compute_dtype and out.shape == reference.shape and torch.isfinite(out).all()
    cosine = torch.nn.functional.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0)
    assert cosine > 0.9  # the same model, its weights rounded to the storage dtype


# -- training -----------------------------------------------------------------------------------------------------


def _loss_and_grads(model, inputs):
    loss = model(**inputs).sample.square().mean()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_gradient_checkpointing_is_applied_and_changes_nothing(inputs):
    plain = tiny_sana_video2_transformer()
    checkpointed = tiny_sana_video2_transformer()
    checkpointed.enable_gradient_checkpointing()
    assert {type(m).__name__ for m in checkpointed.modules()
            if getattr(m, "gradient_checkpointing", False)} == {"SanaVideo2Transformer3DModel"}
    loss, grads = _loss_and_grads(plain, inputs)
    checkpointed_loss, checkpointed_grads = _loss_and_grads(checkpointed, inputs)
    assert torch.equal(loss, checkpointed_loss)
    assert [name for name, grad in grads.items() if grad is None] == []  # every parameter is trained
    assert all(torch.equal(grads[name], checkpointed_grads[name]) for name in grads)


def test_training_step_and_ema(inputs):
    from diffusers.training_utils import EMAModel

    model = tiny_sana_video2_transformer().train()
    ema = EMAModel(model.parameters(), decay=0.9)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(0)  # caption dropout draws in training mode
    _loss_and_grads(model, inputs)
    optimizer.step()
    ema.step(model.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())


# -- compile --------------------------------------------------------------------------------------------------------


def test_compile_fullgraph_without_recompiles(inputs, reference):
    counter = CompileCounter()
    compiled = torch.compile(tiny_sana_video2_transformer(), fullgraph=True, backend=counter)  # never called yet
    first = run(compiled, inputs).sample
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = run(compiled, inputs).sample  # an identical call: the same graph, no recompile
    assert counter.frame_count == 1
    assert torch.equal(first, reference) and torch.equal(second, reference)


def test_compile_repeated_blocks_without_recompiles(inputs, reference):
    model = tiny_sana_video2_transformer()
    counter = CompileCounter()
    model.compile_repeated_blocks(fullgraph=True, backend=counter)
    assert torch.equal(run(model, inputs).sample, reference)
    frames = counter.frame_count
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(run(model, inputs).sample, reference)
    # one graph per kind of call: the linear and the softmax layers' attention sub-layer, and the MLP sub-layer
    assert frames == counter.frame_count == 3


def test_compile_dynamic_on_different_shapes(model):
    counter = CompileCounter()
    compiled = torch.compile(tiny_sana_video2_transformer(), fullgraph=True, dynamic=True, backend=counter)
    with fx_config.patch(use_duck_shape=False), torch._dynamo.config.patch(error_on_recompile=True):
        for height, width in ((4, 6), (6, 8), (8, 4)):
            grid_inputs = sana_video2_transformer_inputs(model, height=height, width=width)
            assert torch.equal(run(compiled, grid_inputs).sample, run(model, grid_inputs).sample)
    assert counter.frame_count == 1


# -- cache: diffusers' block caches are refused, accelpatch's step cache is the way ----------------------------------


def _block_cache_configs():
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, SeaCacheConfig, TextKVCacheConfig

    return [FirstBlockCacheConfig(threshold=0.05), MagCacheConfig(mag_ratios=[1.0] * 28), SeaCacheConfig(),
            TextKVCacheConfig()]


@pytest.mark.parametrize("index", range(4), ids=["FirstBlockCache", "MagCache", "SeaCache", "TextKVCache"])
def test_enable_cache_refuses_diffusers_block_caches_clearly(inputs, reference, index):
    model = tiny_sana_video2_transformer()
    config = _block_cache_configs()[index]
    expected = "NucleusMoE" if index == 3 else r"accelpatch\.apply\(pipe, cache='first_block'\)"
    with pytest.raises(ValueError, match=expected) as error:
        model.enable_cache(config)
    assert type(config).__name__ in str(error.value)
    assert not model.is_cache_enabled
    assert not any(hasattr(block, "_diffusers_hook") for block in model.blocks)
    assert torch.equal(run(model, inputs).sample, reference)


def test_accelpatch_step_cache_is_what_the_error_points_to(inputs, reference):
    import accelpatch

    model = tiny_sana_video2_transformer()
    accelpatch.apply(model, cache="first_block")
    try:
        assert torch.equal(run(model, inputs).sample, reference)  # lossless tier: every block runs
    finally:
        accelpatch.remove(model)

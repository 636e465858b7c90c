"""The memory plan's ways down (issue #44): under group offloading the weights the plan keeps on the device are the
groups diffusers' own ``enable_group_offload(offload_type="block_level", num_blocks_per_group=1)`` makes of each
family's transformer, and a budget the call misses names it where it fits before the lossy moves; torchao's int8 and
fp8 weight-only quantisation is weighed by torchao itself on the meta model, as its codes, scales and zero points."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from accelpatch.memory.live_bytes import module_bytes, storage_bytes
from accelpatch.memory.plan import group_offload_resident
from accelpatch.testing import hunyuan_video15, ltx2, minimax_h3, sana_video, sana_video2, wan

#: a small configuration of each family's transformer (real tensors: diffusers' hooks move them to the CPU)
CONFIGS = {
    "wan": wan.WAN_SOL_CONFIG,
    "sana_video": sana_video.SANA_VIDEO_MEDIUM_CONFIG,
    "sana_video2": sana_video2.SANA_VIDEO2_TINY_CONFIG,
    "minimax_h3": minimax_h3.MINIMAX_H3_SOL_CONFIG,
    "hunyuan_video15": hunyuan_video15.HUNYUAN_VIDEO15_SOL_CONFIG,
    "ltx2": ltx2.LTX2_TINY_CONFIG,
}


def _build(family):
    from accelpatch.memory.plan import memory_settings
    from accelpatch.models.families import resolve

    return resolve(memory_settings(family).transformer)(**dict(CONFIGS[family]))


def _diffusers_groups(model) -> tuple[int, list[int]]:
    """(the bytes of the group diffusers keeps on the device for the whole forward, each block group's bytes), read
    from the hooks diffusers' enable_group_offload installs."""
    model.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1)
    groups = {}
    for module in model.modules():
        registry = module.__dict__.get("_diffusers_hook")
        hook = registry.get_hook("group_offloading") if registry is not None else None
        if hook is not None:
            group = hook.group
            groups[id(group)] = (group, storage_bytes([*(p for m in group.modules for p in m.parameters()),
                                                       *(b for m in group.modules for b in m.buffers()),
                                                       *(group.parameters or []), *(group.buffers or [])]))
    whole = [size for group, size in groups.values() if group.onload_leader is model]
    blocks = [size for group, size in groups.values() if group.onload_leader is not model]
    assert len(whole) == 1 and blocks, groups
    return whole[0], blocks


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_resident_weights_are_diffusers_own_groups(family):
    """Without streams one block group at a time beside the model's own group; with streams the next block
    prefetched too: the plan's figure from diffusers' groups, for a small model of each family."""
    model = _build(family)
    planned, streamed = group_offload_resident(model, stream=False), group_offload_resident(model)
    whole, blocks = _diffusers_groups(model)
    assert whole + sum(blocks) == module_bytes(model)  # every weight in one group
    assert planned == whole + max(blocks)
    assert streamed == whole + max(a + b for a, b in zip(blocks, blocks[1:]))
    assert planned < streamed <= module_bytes(model)  # two-block toys: both blocks resident with streams


@pytest.fixture(scope="module")
def wan_14b_small_plan():
    """Wan 2.1 14B (26.7 GiB of transformer weights, UMT5-XXL's 10.6) at 240 x 416 x 33 with a 24 GiB budget it
    misses, so every way down is weighed."""
    from accelpatch.memory.plan import memory_plan

    return memory_plan("wan2.1-t2v-sol-attn", budget="24GiB", patched=False, frames=33, height=240, width=416)


def test_a_budget_only_group_offloading_meets_names_it_before_fp8(wan_14b_small_plan):
    """24 GiB is out of reach of model offload (the transformer alone is 27 GiB), within reach of group offloading,
    which keeps the output: the plan names it, not the lossy fp8 storage."""
    plan = wan_14b_small_plan
    assert plan.fits() is False and plan.fits(offload=True) is False
    assert plan.fits(group_offload=True) is True
    (line,) = plan.options_to_fit()
    assert line.startswith("to fit 24.00 GiB: group offloading of the transformer: "
                           "transformer.enable_group_offload("), line
    with pytest.raises(ValueError, match="planned one at a time"):
        plan.peak(fp8=True, group_offload=True)


#: bytes per output channel beside the codes: int8 (a float32 scale and an int8 zero point), fp8 (a float32 scale)
PER_ROW = {"int8": 5, "fp8": 4}


@pytest.mark.parametrize("kind", sorted(PER_ROW))
def test_torchao_weights_are_codes_and_scales_as_torchao_lays_them_out(kind):
    """A small Wan transformer in bf16: torchao's quantize_ on the meta model (the plan) holds what it holds on a real
    one, and that is one byte per linear weight (bf16 or kept float32) plus its per-row scale (and zero point), the
    rest as it was; the dequantised temporary is the largest linear weight as it is stored before quantisation."""
    from torchao import quantization

    from accelpatch.memory.plan import TransformerCase, torchao_weights
    from accelpatch.memory.quantised import TORCHAO_CONFIGS, tensor_bytes

    case = TransformerCase("wan", wan.WAN_SOL_CONFIG, 2, 8, 8, 8, dtype="bfloat16")
    planned, temporary = torchao_weights(case, kind)
    real = case.build()
    linears = [m for m in real.modules() if isinstance(m, torch.nn.Linear)]
    rest = module_bytes(real) - sum(m.weight.numel() * m.weight.element_size() for m in linears)  # some float32
    expected = rest + sum(m.weight.numel() + m.weight.shape[0] * PER_ROW[kind] for m in linears)
    assert temporary == max(m.weight.numel() * m.weight.element_size() for m in linears)
    quantization.quantize_(real, getattr(quantization, TORCHAO_CONFIGS[kind])())
    assert planned == tensor_bytes([*real.parameters(), *real.buffers()]) == expected


def test_quantised_weights_are_weighed_and_a_lossless_way_is_named_first(wan_14b_small_plan):
    """At 12 GiB torchao's int8 and fp8 weight-only transformers are weighed (about half the bf16 bytes), but group
    offloading with the prompt encoded on the CPU fits and keeps the output, so the plan names that, not a lossy
    format; the weight formats are planned one at a time."""
    plan = dataclasses.replace(wan_14b_small_plan, budget=12 * 2 ** 30)
    (line,) = plan.options_to_fit()
    assert "the prompt encoded on the CPU and group offloading of the transformer" in line, line
    assert isinstance(plan.details["torchao"]["int8"], tuple) and isinstance(plan.details["torchao"]["fp8"], tuple)
    int8, _ = plan.peak(quantised="int8", offload=True)
    fp8, _ = plan.peak(quantised="fp8", offload=True)
    bf16, _ = plan.peak(offload=True)
    assert int8 < 0.6 * bf16 and fp8 < 0.6 * bf16  # the 14B transformer (the largest stage) in about half
    with pytest.raises(ValueError, match="planned one at a time"):
        plan.peak(fp8=True, quantised="int8")
    with pytest.raises(ValueError, match="no .int4. weights"):
        plan.peak(quantised="int4")


def test_the_text_encoder_in_int8_is_weighed_after_the_lossless_ways(wan_14b_small_plan):
    """UMT5-XXL in torchao int8 weight-only: its linear layers in one byte a weight, its 1.05B-parameter embedding
    still bf16 (about 6.4 of 10.6 GiB); a lossy move, tried after encoding the prompt on the CPU."""
    plan = wan_14b_small_plan
    text = plan.stages[0]
    int8, temporary = plan.details["text_int8"]
    assert 0.5 * text.weights < int8 < 0.7 * text.weights, (int8, text.weights)
    assert temporary == 10240 * 4096 * 2  # the largest linear layer (the feed-forward's) as bf16
    (stage,) = [s for s in plan.stage_list(patched=False, text_int8=True) if s.name == "text encoder"]
    assert stage.weights == int8 and stage.activations == text.activations + temporary
    ranks = {m.short: m.rank for m in plan.moves()}
    assert ranks["the prompt encoded on the CPU"] < ranks["group offloading of the transformer"] < ranks[
        "the text encoder in int8"] < ranks["fp8 weight storage"]


def test_gguf_files_of_the_common_types_are_traced_and_named_after_torchao(wan_14b_small_plan):
    """The 14B from a GGUF Q8_0 file holds about 8.5 bits a weight and from Q4_K about 4.5 (the float32-kept modules,
    the norms and the patch embedding as loaded): 0.53 and 0.28 of bf16; each layer's dequantisation, traced where
    it runs, adds to the step's activations (Q4_K's more: 5.2 bytes a weight against 4), and the moves name them
    after torchao's (every layer dequantised at every call)."""
    plan = wan_14b_small_plan
    bf16 = plan.stages[1].weights
    (q8, q8_extra), (q4, q4_extra) = plan.details["gguf"]["Q8_0"], plan.details["gguf"]["Q4_K"]
    assert 0.5 < q8 / bf16 < 0.6 and 0.25 < q4 / bf16 < 0.32, (q8 / bf16, q4 / bf16)
    assert 0 < q8_extra < q4_extra < 2 ** 30, (q8_extra, q4_extra)
    shorts = [m.short for m in plan.moves()]
    assert shorts[-3:] == ["torchao fp8 weight-only", "GGUF Q8_0 weights", "GGUF Q4_K weights"], shorts
    assert plan.peak(quantised="gguf:Q4_K")[0] < plan.peak(quantised="int8")[0] < plan.peak()[0]
    assert any(a.startswith("GGUF: as diffusers loads a file") for a in plan.assumptions)
    with pytest.raises(ValueError, match="no 'gguf:Q5_K' weights; it has int8, fp8, gguf:Q8_0, gguf:Q4_K"):
        plan.peak(quantised="gguf:Q5_K")

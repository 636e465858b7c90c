"""GGUF weights in the memory plan (issue #44): what a transformer loaded from a GGUF file holds at rest (its codes
as diffusers' loader keeps them) and while it runs (each GGUFLinear dequantises its whole weight), weighed by type
or from a file's header, against diffusers' own loader and layers on real tensors."""
from __future__ import annotations

import pytest
import torch

from accelpatch.memory import LiveBytes, module_bytes
from accelpatch.testing.wan import WAN_SOL_CONFIG

gguf = pytest.importorskip("gguf")  # a dev dependency (setup.cfg); the plan says why where it is missing

from diffusers import GGUFQuantizationConfig, WanTransformer3DModel  # noqa: E402
from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter  # noqa: E402

from accelpatch.memory.gguf_weights import dequantise_peak  # noqa: E402
from accelpatch.memory.plan import TransformerCase, gguf_weights, memory_plan, trace_step  # noqa: E402

Q = gguf.GGMLQuantizationType
#: the small Wan these tests load: 256-wide rows (K-quant blocks are 256 values, the others 32), a 32-wide text input
CASE = TransformerCase("wan", WAN_SOL_CONFIG, 4, 16, 16, 8, dtype="bfloat16")


@pytest.fixture(scope="module")
def plain():
    """The plan's unpatched step of CASE, traced on fake tensors with its linear layers' calls recorded."""
    return trace_step(CASE, linears=True)


def _codes(weight, quant_type):
    values, size = gguf.GGML_QUANT_SIZES[quant_type]
    return GGUFParameter(torch.zeros(weight.shape[0], weight.shape[1] // values * size, dtype=torch.uint8),
                         quant_type=quant_type)


def _loaded(model, kind, folder):
    """``model`` written as a GGUF file with every Linear weight whose rows split into ``kind``'s blocks as ``kind``
    codes (zeros: only their bytes matter here) and the rest float32, then loaded by diffusers' own
    ``from_single_file`` with ``GGUFQuantizationConfig``, in bf16."""
    quant_type = Q[kind]
    values, _ = gguf.GGML_QUANT_SIZES[quant_type]
    model.save_config(folder)
    writer = gguf.GGUFWriter(str(folder / f"{kind}.gguf"), "accelpatch-test")
    for key, value in model.state_dict().items():
        if key.endswith(".weight") and value.ndim == 2 and value.shape[1] % values == 0:
            codes = _codes(value, quant_type).numpy()
            writer.add_tensor(key, codes, raw_shape=codes.shape, raw_dtype=quant_type)
        else:
            writer.add_tensor(key, value.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return WanTransformer3DModel.from_single_file(
        str(folder / f"{kind}.gguf"), config=str(folder), torch_dtype=torch.bfloat16,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q6_K", "Q5_0", "BF16"])
def test_a_layers_dequantisation_is_traced_as_diffusers_gguflinear_holds_it_on_a_real_run(kind):
    """The stand-in weight the trace uses (a fake uint8 tensor with the two attributes diffusers reads) makes
    diffusers' own GGUFLinear create what it creates on a real GGUFParameter: 4 (Q8_0) to 10 (Q5_0) bytes a
    weight."""
    quant_type = Q[kind]
    layer = GGUFLinear(256, 96, bias=False, compute_dtype=torch.bfloat16)
    layer.weight = _codes(layer.weight, quant_type)
    token = torch.zeros(1, 256, dtype=torch.bfloat16)
    with torch.no_grad(), LiveBytes() as live:
        out = layer(token)
    traced = dequantise_peak(96, 256, quant_type, torch.bfloat16)
    assert traced == live.peak - out.numel() * out.element_size()
    assert 4 * 96 * 256 - 96 * 2 <= traced <= 10 * 96 * 256, traced  # less the one output row beside it


def _measured(loaded) -> int:
    """The activations of one real forward of ``loaded`` (its inputs and the peak of what it creates), as the plan
    counts a step's."""
    inputs = CASE.inputs(CASE.build())  # bf16 inputs (the builder reads a model's dtype: the loaded one's is uint8)
    with torch.no_grad(), LiveBytes() as live:
        loaded(**inputs)
    return live.peak + sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_a_transformer_by_type_is_what_diffusers_loads_from_such_a_file_and_runs_within_10_percent(kind, tmp_path,
                                                                                                    plain):
    """The plan's bytes are exactly those diffusers' loader holds for a file of that type (the time embedder, which
    Wan keeps in float32, dequantised at load; Q4_K leaves the 32-wide text projection in bf16: its rows do not
    split into 256-value blocks), and its traced step (diffusers' GGUFLinear dequantising on fake tensors) peaks
    within 10 % of a real forward of what the loader made, which holds more than the bf16 model's forward."""
    weights, extra = gguf_weights(CASE, kind, plain)
    activations = plain.activations + extra
    real = _loaded(WanTransformer3DModel(**WAN_SOL_CONFIG), kind, tmp_path)
    assert any(isinstance(m, GGUFLinear) for m in real.modules())
    assert weights == module_bytes(real) < 0.7 * module_bytes(CASE.build())
    kept = {n for n, m in real.named_modules() if isinstance(m, torch.nn.Linear) and not isinstance(m, GGUFLinear)}
    assert ("condition_embedder.text_embedder.linear_1" in kept) == (kind == "Q4_K"), kept
    measured = _measured(real)
    assert abs(activations - measured) <= 0.10 * measured, (activations, measured)
    assert extra > 0


def test_an_unknown_type_is_refused_with_the_types_diffusers_loads():
    with pytest.raises(ValueError, match=r"GGUF type must be one of .*Q4_K.*Q8_0.*got 'Q9_9'"):
        gguf_weights(CASE, "Q9_9", None)


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    """The small Wan as a GGUF file (Q8_0 for the Linears whose rows split into 32 values, float32 for the rest)
    and its config folder, written with the gguf package."""
    from _works_with_tools import write_gguf_checkpoint

    folder = tmp_path_factory.mktemp("wan_gguf")
    source = WanTransformer3DModel(**WAN_SOL_CONFIG)
    source.save_config(folder)
    write_gguf_checkpoint(source, folder / "wan-Q8_0.gguf")
    return folder


def test_a_file_is_weighed_from_its_header_as_from_single_file_loads_it_and_its_run_is_planned(q8_file, plain):
    """diffusers' ``from_single_file`` with ``GGUFQuantizationConfig`` holds exactly the bytes the plan reads from
    the file's header, and one real forward of what it loaded peaks within 10 % of the plan's traced step."""
    loaded = WanTransformer3DModel.from_single_file(
        str(q8_file / "wan-Q8_0.gguf"), config=str(q8_file), torch_dtype=torch.bfloat16,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16)).eval()
    weights, extra = gguf_weights(CASE, q8_file / "wan-Q8_0.gguf", plain)
    activations = plain.activations + extra
    assert weights == module_bytes(loaded)
    measured = _measured(loaded)
    assert abs(activations - measured) <= 0.10 * measured, (activations, measured)


#: diffusers' Wan names -> the original checkpoint's (the inverse of diffusers' convert_wan_transformer_to_diffusers
#: renames this model has; norm2 and norm3 swap), to write a file as the community's Wan GGUF files are named
ORIGINAL_WAN_NAMES = (("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
                      ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
                      ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
                      ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
                      ("condition_embedder.time_proj", "time_projection.1"), ("attn1", "self_attn"),
                      ("attn2", "cross_attn"), (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."),
                      (".to_v.", ".v."), ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head"),
                      ("norm2", "norm__swap"), ("norm3", "norm2"), ("norm__swap", "norm3"))


def _original_name(key: str) -> str:
    if key == "scale_shift_table":
        return "head.modulation"
    for ours, theirs in ORIGINAL_WAN_NAMES:
        key = key.replace(ours, theirs)
    return key.replace("scale_shift_table", "modulation")


def test_a_file_in_the_original_checkpoints_names_gives_each_layer_the_type_diffusers_loads_it_in(tmp_path):
    """A Q4_K_M-like file (attention projections Q8_0, feed-forwards Q4_K, the rest F32; the time embedder Q8_0,
    which Wan keeps in float32 and the loader dequantises) named as the original Wan checkpoint is, as the
    community's files are: each linear layer is weighed in the type diffusers' ``from_single_file`` gives it after
    renaming (read off every GGUFLinear it loads), and the bytes are the loader's. (The file's most common type for
    every layer, as before, gets the attention layers wrong.)"""
    from accelpatch.memory.gguf_weights import file_types

    source = WanTransformer3DModel(**WAN_SOL_CONFIG)
    source.save_config(tmp_path)
    writer = gguf.GGUFWriter(str(tmp_path / "wan-mixed.gguf"), "accelpatch-test")
    for key, value in source.state_dict().items():
        linear = key.endswith(".weight") and value.ndim == 2
        kind = Q.Q8_0 if linear and (".attn" in key or "time_embedder" in key) else (
            Q.Q4_K if linear and ".ffn." in key else None)
        name = _original_name(key)
        if kind is None:
            writer.add_tensor(name, value.float().numpy())
        else:
            codes = _codes(value, kind).numpy()
            writer.add_tensor(name, codes, raw_shape=codes.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = WanTransformer3DModel.from_single_file(
        str(tmp_path / "wan-mixed.gguf"), config=str(tmp_path), torch_dtype=torch.bfloat16,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16))
    quantised = {name: m.weight.quant_type for name, m in loaded.named_modules() if isinstance(m, GGUFLinear)
                 and isinstance(m.weight, GGUFParameter)}
    assert set(quantised.values()) == {Q.Q8_0, Q.Q4_K} and len(quantised) == 20, quantised  # 2 blocks x (8 + 2)

    types, weights = file_types(tmp_path / "wan-mixed.gguf", CASE.meta_model(), torch.bfloat16)
    planned = {name: types(name, tuple(m.weight.shape)) for name, m in loaded.named_modules()
               if isinstance(m, torch.nn.Linear)}
    assert {name: t for name, t in planned.items() if t is not None} == quantised, planned
    assert weights == module_bytes(loaded)


def test_a_file_of_another_model_is_said_not_weighed(q8_file):
    from accelpatch.testing.wan import WAN_TINY_CONFIG

    other = TransformerCase("wan", WAN_TINY_CONFIG, 2, 8, 8, 8, dtype="bfloat16")
    said = gguf_weights(other, q8_file / "wan-Q8_0.gguf", None)
    assert isinstance(said, str) and "wan-Q8_0.gguf holds 0." in said and "a file of another model" in said, said
    with pytest.raises(ValueError, match="no GGUF file at"):
        gguf_weights(other, q8_file / "missing.gguf", None)


def _sparse_gguf(path, model, kind) -> int:
    """``model`` (on the meta device) as a GGUF file of full size whose data are holes (a sparse file: its header is
    real, its tensors read as zeros and take no disk): every Linear weight whose rows split into ``kind``'s blocks as
    ``kind``, the rest F32, in diffusers' names. Returns the bytes diffusers' loader would hold for it in bf16: the
    codes as stored, the F32 tensors in bf16 but those of the modules Wan keeps in float32 (its time embedder, norms
    and modulation tables), whose codes are dequantised to float32, and the float32 buffers the model makes itself
    (rope's)."""
    import numpy as np

    quant_type = Q[kind]
    values, size = gguf.GGML_QUANT_SIZES[quant_type]
    linears = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    keep = model._keep_in_fp32_modules  # diffusers' rule: a parameter whose dotted name has one of them stays float32
    writer = gguf.GGUFWriter(str(path), "accelpatch-test")
    held = 0
    for key, value in model.state_dict().items():
        if key in linears and value.shape[1] % values == 0:
            shape = (value.shape[0], value.shape[1] // values * size)
            writer.add_tensor_info(key, shape, np.dtype(np.uint8), shape[0] * shape[1], raw_dtype=quant_type)
            held += value.numel() * 4 if any(k in key.split(".") for k in keep) else shape[0] * shape[1]
        else:
            writer.add_tensor_info(key, tuple(value.shape), np.dtype(np.float32), value.numel() * 4)
            held += value.numel() * (4 if any(k in key.split(".") for k in keep) else 2)
    state = model.state_dict()
    held += sum(b.numel() * 4 for name, b in model.named_buffers() if name not in state)  # rope's, made at load
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as f:  # the data section, padded as the writer pads it, as a hole
        end = f.seek(0, 2)
        data = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, writer.data_alignment) for ti in writer.tensors[0].values())
        f.truncate(gguf.GGUFWriter.ggml_pad(end, writer.data_alignment) + data)
    return held


@pytest.fixture(scope="module")
def full_size_file(tmp_path_factory):
    """Wan 2.1 1.3B (the recipe's released configuration) as a Q4_K GGUF file of full size, data as holes."""
    from accelpatch.testing.wan import WAN_1_3B_CONFIG

    with torch.device("meta"):
        model = WanTransformer3DModel(**WAN_1_3B_CONFIG)
    path = tmp_path_factory.mktemp("gguf_full") / "wan2.1-1.3b-Q4_K.gguf"
    return path, _sparse_gguf(path, model, "Q4_K")


def test_the_plan_weighs_a_full_size_file_and_the_command_prints_its_row(full_size_file, capsys, monkeypatch):
    """``memory --gguf FILE`` on the released 1.3B: the file's bytes as diffusers' loader holds them (codes as stored,
    F32 tensors in bf16, the time embedder dequantised to float32), about 0.3x the bf16 transformer, and a peak row of
    its own under the table."""
    from accelpatch.__main__ import main

    path, held = full_size_file
    argv = ["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", "--unpatched-only", "--frames", "5", "--height", "96",
            "--width", "160", "--no-progress", "--gguf", str(path)]
    from accelpatch.memory import plan as plan_module

    made = []  # the command's own plan (one trace), spied on
    monkeypatch.setattr(plan_module, "memory_plan", lambda *a, **k: made.append(memory_plan(*a, **k)) or made[-1])
    assert main(argv) == 0
    out = capsys.readouterr().out
    (plan,) = made
    weights, extra = plan.details["gguf"][path.name]
    assert weights == held and 0.25 < weights / plan.stages[1].weights < 0.35, (weights, plan.stages[1].weights)
    assert extra > 0  # a layer's dequantisation held beside the activations
    assert plan.peak(quantised=f"gguf:{path.name}")[0] < plan.peak()[0]  # every component resident
    (row,) = [line for line in out.splitlines() if line.startswith(f"unpatched, from {path.name}")]  # as asked
    assert "GiB" in row and f"({path.name}: transformer weights" in out and "GGUF: as diffusers loads a file" in out


def test_a_plan_given_a_file_of_another_model_says_so_in_its_table(q8_file):
    path = q8_file / "wan-Q8_0.gguf"
    plan = memory_plan("wan2.1-t2v-1.3b-sol-attn", frames=5, height=96, width=160, patched=False, gguf=path)
    said = plan.details["gguf"][path.name]
    assert isinstance(said, str) and "this transformer 1.419B parameters: a file of another model" in said, said
    assert f"{path.name}: not weighed: {said}" in plan.table()

"""Wan VACE and Wan Animate (#41): two families added the registry's way (``accelpatch/models/wan_vace/`` and
``accelpatch/models/wan_animate/``), on the code they share with Wan. ``apply()`` no longer refuses them; their site
tables put Wan's fast paths where diffusers shares Wan's code (VACE: Wan's very classes; Animate: diffusers' copies of
them) and leave the rest unpatched or always dense, with the reason; the default tier is diffusers' bits with the
fused ops running, on the model and on a tiny pipeline; ``remove()`` restores; with ``sol_attn`` the sparse path runs
on the main blocks' self-attention only, and a dense stand-in kernel shows its restated q/k/v are the processor's.
"""
import types
import warnings

import pytest
import torch

import accelpatch
from _tiny_pipeline_checks import dense_kernel
from _model_fusion_checks import bits_equal, fresh_verdicts, fusion_of  # noqa: F401 - fresh_verdicts: fixture
from _sol_attn_models import (SPARSE, ModelCase, check_exact_lossless_and_default_dense_layers,
                              check_pickle_and_deepcopy, sol_attn_runs)
from accelpatch.core.sites import SITE_ATTR
from accelpatch.core.gated_class import is_gated
from accelpatch.models.families import by_cli, families
from accelpatch.models.registry import find_adapter
from accelpatch.models.wan import high as wan_high
from accelpatch.models.wan_animate import high as animate_high
from accelpatch.models.wan_vace import high as vace_high
from accelpatch.testing import (WAN_ANIMATE_TINY_CONFIG, WAN_VACE_TINY_CONFIG, tiny_wan_animate_pipeline,
                                tiny_wan_animate_transformer, tiny_wan_vace_pipeline, tiny_wan_vace_transformer,
                                wan_animate_pipeline_call_kwargs, wan_animate_transformer_inputs,
                                wan_vace_pipeline_call_kwargs, wan_vace_transformer_inputs)

KEYS = ("wan_vace", "wan_animate")
TIER = {"exact": 0, "lossless": 1, "high": 2}

#: per family: the tiny builders, the adapter, the diffusers class, the small inputs and the site kind of its own
#: always-dense attention under sol_attn (VACE's control branch, Animate's face adapter)
FAMILY = {
    "wan_vace": types.SimpleNamespace(
        build=tiny_wan_vace_transformer, inputs=wan_vace_transformer_inputs, tiny=WAN_VACE_TINY_CONFIG,
        pipeline=tiny_wan_vace_pipeline, call=wan_vace_pipeline_call_kwargs, adapter="WanVACEAdapter",
        model_class="WanVACETransformer3DModel", dense_kind="wan_vace_control_attention",
        dense_reason=vace_high.CONTROL_DENSE),
    "wan_animate": types.SimpleNamespace(
        build=tiny_wan_animate_transformer, inputs=wan_animate_transformer_inputs, tiny=WAN_ANIMATE_TINY_CONFIG,
        pipeline=tiny_wan_animate_pipeline, call=wan_animate_pipeline_call_kwargs, adapter="WanAnimateAdapter",
        model_class="WanAnimateTransformer3DModel", dense_kind="wan_animate_face_attention",
        dense_reason=animate_high.FACE_DENSE),
}


def _rows(*paths, kind, tier, layer=True):
    return [(path, [(kind, tier, int(path.split(".")[1]) if layer else None)]) for path in paths]


#: the site tables' rows on the tiny models (2 main blocks; VACE: a control block at layers 0 and 1; Animate: one
#: face adapter), written out: (path, [(kind, tier, layer), ...] highest tier first)
MAIN_LOSSLESS = [row for i in (0, 1) for row in (
    (f"blocks.{i}", [("wan_fused_block", "lossless", i)]),
    (f"blocks.{i}.attn1", [("wan_fused_attention", "lossless", i)]))]
LOSSLESS = {
    "wan_vace": MAIN_LOSSLESS + [(f"vace_blocks.{i}.attn1", [("wan_fused_attention", "lossless", None)])
                                 for i in (0, 1)],
    "wan_animate": MAIN_LOSSLESS,
}
SOL_ATTN = {
    "wan_vace": [
        ("blocks.0", [("wan_fused_block", "lossless", 0)]),
        ("blocks.0.attn1", [("wan_sol_attn", "high", 0), ("wan_fused_attention", "lossless", 0)]),
        ("blocks.1", [("wan_fused_block", "lossless", 1)]),
        ("blocks.1.attn1", [("wan_sol_attn", "high", 1), ("wan_fused_attention", "lossless", 1)]),
        *[(f"vace_blocks.{i}.attn1", [("wan_vace_control_attention", "high", None),
                                      ("wan_fused_attention", "lossless", None)]) for i in (0, 1)],
        *_rows("blocks.0.attn2", "blocks.1.attn2", kind="wan_cross_attention", tier="high"),
        *_rows("vace_blocks.0.attn2", "vace_blocks.1.attn2", kind="wan_vace_control_attention", tier="high",
               layer=False)],
    "wan_animate": [
        ("blocks.0", [("wan_fused_block", "lossless", 0)]),
        ("blocks.0.attn1", [("wan_sol_attn", "high", 0), ("wan_fused_attention", "lossless", 0)]),
        ("blocks.1", [("wan_fused_block", "lossless", 1)]),
        ("blocks.1.attn1", [("wan_sol_attn", "high", 1), ("wan_fused_attention", "lossless", 1)]),
        *_rows("blocks.0.attn2", "blocks.1.attn2", kind="wan_cross_attention", tier="high"),
        ("face_adapter.0", [("wan_animate_face_attention", "high", None)])],
}


def _stacks(adapter, model, backend):
    """Per module, in the order modules first appear, its (kind, tier, layer) rows, highest tier first (as
    tests/test_site_tables.py reads a table)."""
    grouped = {}
    for path, module, fast_path, layer in adapter.iter_sites(model, adapter.complete_backend(backend, model)):
        grouped.setdefault(path, []).append((fast_path.fusion.name, str(fast_path.tier), layer))
    return [(path, sorted(rows, key=lambda row: -TIER[row[1]])) for path, rows in grouped.items()]


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _small(key):
    """The diffusers-fast-test-sized model (head dim 12) and inputs of 2 (VACE) or 3 (Animate: the reference frame
    and 2) latent frames of 16 x 16, and its unpatched output."""
    torch.set_num_threads(1)
    family = FAMILY[key]
    model = family.build(family.tiny)
    inputs = family.inputs(model, num_frames=2 if key == "wan_vace" else 3, height=16, width=16)
    return model, inputs, _forward(model, inputs)


# -- the registration: apply() no longer refuses them -------------------------------------------------------------

@pytest.mark.parametrize("key", KEYS)
def test_apply_no_longer_refuses_the_model_and_the_family_is_registered(key):
    family = FAMILY[key]
    model, inputs, reference = _small(key)
    adapter = find_adapter(model)  # raised "accelpatch does not support WanVACETransformer3DModel" before #41
    assert type(adapter).__name__ == family.adapter and type(adapter).__module__ == f"accelpatch.models.{key}.adapter"
    registered = by_cli(key.replace("_", "-"))
    assert registered.key == key and registered.adapter_class() is type(adapter)
    assert registered.diffusers_tests == f"tests/models/transformers/test_models_transformer_{key}.py"
    assert [f.key for f in families()].index(key) == [f.key for f in families()].index("wan") + KEYS.index(key) + 1
    report = accelpatch.apply(model)
    assert [m.model_class for m in report.models] == [family.model_class]
    accelpatch.remove(model)
    # the same lookup still refuses what no family takes: the check can fail
    with pytest.raises(ValueError, match=f"does not support Linear; supported model classes: .*{family.model_class}"):
        find_adapter(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("backend", [None, "sol_attn"], ids=["default", "sol_attn"])
@pytest.mark.parametrize("key", KEYS)
def test_the_site_table_puts_wans_paths_where_diffusers_shares_wans_code(key, backend):
    from accelpatch.sol_attn.config import SolAttnConfig

    model, _, _ = _small(key)
    expected = (LOSSLESS if backend is None else SOL_ATTN)[key]
    assert _stacks(find_adapter(model), model, SolAttnConfig() if backend else None) == expected
    if key == "wan_vace":  # the very objects of Wan's table: VACE's main blocks are Wan's classes
        from accelpatch.models.wan import adapter as wan_adapter
        from accelpatch.models.wan_vace import adapter as vace_adapter

        wan_paths = {rule.fast_path for rule in wan_adapter.SITES}
        assert [rule.fast_path in wan_paths for rule in vace_adapter.SITES] == [True] * 6 + [False]


def test_animates_restated_functions_are_diffusers_copies_of_wans_with_their_fingerprints_recorded():
    """Animate's paths restate diffusers' copies in ``transformer_wan_animate``: each copy's fingerprint is Wan's
    (the same code), and is recorded for the tested diffusers, so that a copy drifting from Wan declines its path."""
    from accelpatch.core import restated
    from accelpatch.models.wan_animate import high, lossless

    names = {name for path in (lossless.FUSED_BLOCK, lossless.FUSED_ATTENTION, high.SOL_ATTENTION)
             for name in path.restates}
    assert names == {f"diffusers.models.transformers.transformer_wan_animate:{name}" for name in (
        "WanTransformerBlock.forward", "WanAttnProcessor.__call__", "WanAttention.forward")}
    for name in sorted(names):
        wan = name.replace("transformer_wan_animate:", "transformer_wan:")
        assert restated.fingerprint(restated.resolve(name)) == restated.fingerprint(restated.resolve(wan)), name
        assert restated.mismatch(name) is None, restated.mismatch(name)  # recorded (the fingerprints file)


# -- the default tier: diffusers' bits with the fused ops running; remove() restores --------------------------------

#: fused-op calls per forward of the small models: two modulations and two gated residual adds per main block, one
#: RoPE pair per self-attention (VACE: the two control blocks' too)
PER_FORWARD = {"wan_vace": {"modulate": 4, "gated_residual": 4, "rope_pair": 4},
               "wan_animate": {"modulate": 4, "gated_residual": 4, "rope_pair": 2}}


@pytest.mark.parametrize("key", KEYS)
def test_default_tier_is_bit_identical_with_the_fused_ops_running_and_remove_restores(key):
    model, inputs, reference = _small(key)
    classes = [type(m) for m in model.modules()]
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a site rejected at apply (or a declined op) would warn
        for _ in range(2):  # first sight, then the verified kernels
            assert bits_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    assert [(s.path, s.kind, s.mounted, s.fast_calls) for s in report.sites] == [
        (path, rows[0][0], True, 2) for path, rows in LOSSLESS[key]]
    for op, calls in PER_FORWARD[key].items():
        fusion = fusion_of(report, op)
        assert fusion.fused_calls == 2 * calls and not fusion.declined, fusion
    # what the table leaves alone stays diffusers' own: VACE's control blocks, Animate's face adapter and encoders
    unpatched = ([model.vace_blocks[0], model.vace_blocks[1]] if key == "wan_vace" else
                 [model.face_adapter[0], model.motion_encoder, model.face_encoder])
    assert not any(is_gated(m) for m in unpatched)
    with accelpatch.quality("exact"):
        assert bits_equal(_forward(model, inputs), reference)
    assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 2 * PER_FORWARD[key]["modulate"]
    accelpatch.remove(model)
    assert [type(m) for m in model.modules()] == classes
    assert not any(SITE_ATTR in m.__dict__ for m in model.modules())
    assert bits_equal(_forward(model, inputs), reference)
    # the comparison can fail: one ulp off in one element is caught
    perturbed = reference.clone()
    perturbed.view(-1)[0] = torch.nextafter(perturbed.view(-1)[0], torch.tensor(float("inf")))
    assert not bits_equal(_forward(model, inputs), perturbed)


@pytest.mark.parametrize("key", KEYS)
def test_a_tiny_pipeline_is_patched_bit_identical_reported_and_restored(key):
    torch.set_num_threads(1)
    family = FAMILY[key]
    pipe = family.pipeline()
    call = dict(height=64, width=64, num_frames=5)  # 2 latent frames of 8 x 8 (Animate: and the reference frame)
    reference = pipe(**family.call(**call)).frames
    accelpatch.apply(pipe)
    assert bits_equal(pipe(**family.call(**call)).frames, reference)
    report = accelpatch.report(pipe)
    assert [m.model_class for m in report.models] == [family.model_class]
    assert [s.path for s in report.sites] == [path for path, _ in LOSSLESS[key]]
    assert all(s.mounted and s.fast_calls > 0 for s in report.sites), report
    text = str(report)
    assert all(path in text for path, _ in LOSSLESS[key]) and "wan_fused_block" in text
    accelpatch.remove(pipe)
    assert not any(is_gated(m) for m in pipe.transformer.modules())
    assert bits_equal(pipe(**family.call(**call)).frames, reference)


@pytest.mark.parametrize("key", KEYS)
def test_the_step_cache_is_refused_with_its_reason(key):
    model, _, _ = _small(key)
    where = "control hints" if key == "wan_vace" else "face adapter"
    refusal = f"cache method 'first_block' is not available for Wan .*{where}.*it runs none"
    with pytest.raises(ValueError, match=refusal):
        accelpatch.apply(model, cache="first_block")
    assert not any(is_gated(m) for m in model.modules())


# -- sol_attn: sparse on the main blocks' self-attention, the rest dense with its reason ----------------------------

def _case(key):
    family = FAMILY[key]
    frames = 2 if key == "wan_vace" else 3  # 512 video tokens (Animate: 768 with the reference frame): 8-12 blocks
    return ModelCase(build=lambda num_layers=None: family.build(), outputs=lambda out: (out.sample,),
                     inputs=lambda m: family.inputs(m, num_frames=frames, height=32, width=32),
                     sol_kind="wan_sol_attn", weight=lambda m: m.blocks[0].attn1.to_q.weight)


@pytest.fixture(scope="module", params=KEYS)
def sol_model(request):
    torch.set_num_threads(1)
    case = _case(request.param)
    model = case.build()
    inputs = case.inputs(model)
    return request.param, case, model, inputs, _forward(model, inputs)


@pytest.fixture
def sol(sol_model):
    yield sol_model
    accelpatch.remove(sol_model[2])


def test_sol_attn_runs_sparse_on_the_main_self_attention_and_keeps_the_rest_dense(sol):
    key, case, model, inputs, reference = sol
    family = FAMILY[key]
    check_exact_lossless_and_default_dense_layers(case, (model, inputs, reference),
                                                  ["blocks.0.attn1", "blocks.1.attn1"])
    accelpatch.apply(model, **SPARSE)
    out = _forward(model, inputs)
    assert torch.isfinite(out).all() and not torch.equal(out, reference)
    report = accelpatch.report(model)
    sparse = [s for s in report.sites if s.kind == "wan_sol_attn"]
    assert [(s.path, s.fast_calls) for s in sparse] == [("blocks.0.attn1", 1), ("blocks.1.attn1", 1)]
    assert all(0 < s.stats["exact_fraction"] < 1 for s in sparse), sparse
    assert [(s.path, s.reference_calls) for s in report.sites if s.kind == "wan_cross_attention"] == [
        (f"blocks.{i}.attn2", {wan_high.CROSS_DENSE: 1}) for i in (0, 1)]
    dense = [(s.path, s.fast_calls, s.reference_calls) for s in report.sites if s.kind == family.dense_kind]
    paths = ([f"vace_blocks.{i}.attn1" for i in (0, 1)] + [f"vace_blocks.{i}.attn2" for i in (0, 1)]
             if key == "wan_vace" else ["face_adapter.0"])
    assert sorted(dense) == sorted((p, 0, {family.dense_reason: 1}) for p in paths)
    assert report.fallback_calls == {}


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_the_restated_projection_is_the_processors_and_a_wrong_kernel_is_caught(sol, monkeypatch, fused_qkv):
    import accelpatch.sol_attn.op as ops

    key, case, model, inputs, reference = sol
    if fused_qkv:  # diffusers' fuse_qkv_projections: one to_qkv linear (numerically another GEMM: a new reference)
        model.fuse_qkv_projections()
        reference = _forward(model, inputs)
    try:
        accelpatch.apply(model, **SPARSE)
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(total_pairs=1))
        assert bits_equal(_forward(model, inputs), reference)  # q/k/v, RoPE and to_out exactly as the processor's
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(perturb=True, total_pairs=1))
        assert not torch.equal(_forward(model, inputs), reference)  # the same check sees a one-element error
        assert sol_attn_runs([s for s in accelpatch.report(model).sites if s.kind == "wan_sol_attn"]) == 4
    finally:
        accelpatch.remove(model)
        if fused_qkv:
            model.unfuse_qkv_projections()


def test_a_copy_and_a_pickle_keep_the_sparse_path_and_remove_to_diffusers_bits(sol):
    key, case, model, inputs, reference = sol
    check_pickle_and_deepcopy(case, (model, inputs, (reference,)))


@pytest.mark.parametrize("key", KEYS)
def test_a_layout_the_adapter_does_not_know_is_refused_at_apply(key):
    from diffusers.models.transformers import transformer_wan

    model, _, _ = _small(key)
    if key == "wan_vace":  # a processor of the user's on the control branch
        class Custom(transformer_wan.WanAttnProcessor):
            pass

        model.vace_blocks[1].attn1.set_processor(Custom())
        expected = "vace_blocks.1.attn1.processor is Custom, expected WanAttnProcessor"
    else:  # Wan's own processor is not the copy Animate's paths restate
        model.blocks[0].attn1.set_processor(transformer_wan.WanAttnProcessor())
        expected = ("blocks.0.attn1.processor is WanAttnProcessor, expected "
                    "diffusers.models.transformers.transformer_wan_animate.WanAttnProcessor")
    with pytest.raises(ValueError, match=f"differs: {expected}; sol_attn is not applied"):
        accelpatch.apply(model, backend="sol_attn")
    assert not any(is_gated(m) for m in model.modules())

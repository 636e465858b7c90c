"""The contract every registered model family keeps (#41), one suite parametrised over
``accelpatch.models.families.families()``, in the style of diffusers' tester mixins: a family registered by its
package is checked here without a line of this file changing, through its tiny builders in ``accelpatch.testing``
(``tiny_<key>_transformer``, ``<key>_transformer_inputs``, ``tiny_<key>_pipeline``, ``<key>_pipeline_call_kwargs``:
the convention of accelpatch/models/families.py).

Every family: its builders exist and are seeded; ``apply()`` mounts a site on exactly the modules its site table
names, and the report lists them; the default, ``lossless`` and ``exact`` tiers give the unpatched bits (fp32 and
bf16, batch 1 and 2), counted as such; ``exact`` calls no fused op; applying twice is applying once and ``remove()``
restores the model bit for bit; saved files never change; copies, pickles and compiled graphs keep the bits;
training gradients are the unpatched ones; an unsupported model is refused naming the family's classes; and the tiny
pipeline gives its unpatched outputs at the default tiers and after ``remove()``.

Families whose adapter is a ``SolAttnAdapter`` (the Sol-Attn path runs on a CPU), with ``backend="sol_attn"``:
``exact``/``lossless`` and the default dense layers are the unpatched bits; a kernel that raises falls back, warned
once and counted, and ``strict`` raises; copies and pickles keep the sparse path; gradients flow through it, also
under gradient checkpointing; in the pipeline ``exact``, every step dense (``dense_steps=1.0``) and the defaults on
the tiny sequences (the first 20 % of the steps dense, the rest below the ``min_tokens`` floor) are the unpatched bits,
each call counted with its reason, while ``high`` runs sparse into the output; and with the defaults (``min_tokens=0``
for the tiny sequences) a 4-step call runs sparse on every step after the first, except dense layers.

Bit identity is raw bits with dtype, shape and stride, never ``allclose``. What is particular to a family stays in
its own test file (tests/test_<family>*.py); what the checks are made of is tests/_family_contract.py.
"""
from __future__ import annotations

import hashlib
import importlib
import warnings

import pytest
import torch

import _fused_doubles as doubles
import accelpatch
from _family_contract import (EXACT_ADMITS_NO_HIGH, EXACT_ADMITS_NO_LOSSLESS, FAMILIES, INT_VIEWS,
                              LOSSLESS_ADMITS_NO_HIGH, SOL_FAMILIES, SPARSE, all_same, backends, calls,
                              check_copies_keep_the_bits, check_restored, counts, forward, module_bits, module_state,
                              outputs, pipeline_call, quiet_apply, run_pipeline, same_bits, sol_attn_runs, sol_site_layers,
                              sol_sites, states_equal, table_sites, tiny, transformer_forwards, with_and_without)
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.core.sites import SITE_ATTR
from accelpatch.lossless import verify
from accelpatch.sol_attn import sites as sol_attention
from accelpatch.sol_attn.config import DENSE_LAYER, DENSE_STEP, NOTHING_SKIPPED, SHORT_SEQUENCE

every_family = pytest.mark.parametrize("family", FAMILIES, ids=[f.key for f in FAMILIES])
every_sol_family = pytest.mark.parametrize("family", SOL_FAMILIES, ids=[f.key for f in SOL_FAMILIES])


# -- fixtures --------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(request):
    """Per family: its builders, and its tiny fp32 transformer with the default inputs and unpatched outputs (built
    once per module; tests that change it leave it unpatched)."""
    family = request.param
    builders = tiny(family)
    model = builders.transformer()
    inputs = builders.inputs(model)
    return family, builders, model, inputs, forward(model, inputs)


@pytest.fixture
def model(built):
    yield built
    accelpatch.remove(built[2])


@pytest.fixture(scope="module")
def pipeline(request):
    """Per family: its tiny pipeline (seed 0) and the unpatched outputs of one call."""
    family = request.param
    builders = tiny(family)
    pipe = builders.pipeline(seed=0)
    return family, builders, pipe, run_pipeline(family, builders, pipe)


def per_family(fixture: str, families_=FAMILIES):
    return pytest.mark.parametrize(fixture, families_, ids=[f.key for f in families_], indirect=True)


@pytest.fixture
def stand_in_kernels():
    """The fused ops' CPU kernels replaced by the stand-ins of tests/_fused_doubles.py (each its reference chain,
    counting its calls), with fresh first-sight verdicts."""
    for op in verify.ops().values():
        op.forget()
    doubles.CALLS.clear()
    with doubles.substituted():
        yield
    for op in verify.ops().values():
        op.forget()


# -- the builders ----------------------------------------------------------------------------------------------------

@every_family
def test_the_family_has_its_tiny_builders_in_its_own_module(family):
    builders = tiny(family)
    module = importlib.import_module(f"accelpatch.testing.{family.key}")
    for fn in vars(builders).values():
        assert fn.__module__ == module.__name__, (fn.__name__, fn.__module__)
    assert family.adapter_class().model_classes, family.key


@every_family
def test_two_transformers_built_with_one_seed_are_one_model(family):
    builders = tiny(family)
    first, second, other = builders.transformer(seed=0), builders.transformer(seed=0), builders.transformer(seed=1)
    assert states_equal(first.state_dict(), second.state_dict())
    assert not states_equal(first.state_dict(), other.state_dict())


# -- apply: the site table -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("built,backend", with_and_without([f for f in FAMILIES if "sol_attn" in backends(f)]),
                         indirect=["built"])
def test_apply_mounts_a_site_on_exactly_the_modules_the_table_names(model, backend):
    family, _, m, inputs, reference = model
    classes = {name: type(mod) for name, mod in m.named_modules()}
    report = quiet_apply(m, **({} if backend is None else SPARSE))
    found = [(s.path, s.kind) for s in report.sites]
    assert found and len(found) == len(set(found))
    assert set(found) == table_sites(family, m, backend)
    assert [(s.path, s.kind) for s in accelpatch.report(m).sites] == found
    text = str(report)
    for site in report.sites:
        module = m.get_submodule(site.path)
        assert isinstance(module, classes[site.path]) and type(module) is not classes[site.path], site.path
        assert site.path in text and site.kind in text
        if site.tier == "lossless":  # the bit-exact paths need no CUDA
            assert site.mounted and site.reason is None, site
        else:
            assert site.mounted or site.reason, site  # a high path that cannot run here says why
    assert report.models[0].default_tier == ("lossless" if backend is None else "high")


@every_family
def test_an_unsupported_model_is_refused_naming_the_familys_classes(family):
    names = [name for _, name in family.adapter_class().model_classes]
    assert set(names) <= set(accelpatch.supported_models())
    with pytest.raises(ValueError, match="does not support Linear; supported model classes: ") as refused:
        accelpatch.apply(torch.nn.Linear(2, 2))
    assert all(name in str(refused.value) for name in names), (names, str(refused.value))
    if "sol_attn" in backends(family):
        with pytest.raises(ValueError, match="supported model classes: ") as refused:
            accelpatch.apply(torch.nn.Linear(2, 2), backend="sol_attn")
        assert all(name in str(refused.value) for name in names)


# -- the default tiers -----------------------------------------------------------------------------------------------

@every_family
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_lossless_and_exact_are_the_unpatched_bits_and_counted_so(family, dtype, batch):
    builders = tiny(family)
    m = builders.transformer(dtype=dtype)
    inputs = builders.inputs(m, batch_size=batch, seed=batch)
    reference = forward(m, inputs)
    quiet_apply(m)
    try:
        assert all_same(forward(m, inputs), reference)  # the default tier: lossless
        first = accelpatch.report(m)
        per_call = {(s.path, s.kind): calls(s) for s in first.sites}
        assert all(per_call.values()), per_call  # every site took part in the forward
        for tier in ("lossless", "exact"):
            with accelpatch.quality(tier):
                assert all_same(forward(m, inputs), reference), tier
        rep = accelpatch.report(m)
    finally:
        accelpatch.remove(m)
    assert first.fallback_calls == {} and rep.fallback_calls == {}
    for before, site in zip(first.sites, rep.sites):
        c = per_call[(site.path, site.kind)]
        if site.tier == "high":  # never asked at these tiers: every call counted with the tier's reason
            assert (before.fast_calls, before.reference_calls) == (0, {LOSSLESS_ADMITS_NO_HIGH: c}), before
            assert (site.fast_calls, site.reference_calls) == (0, {LOSSLESS_ADMITS_NO_HIGH: 2 * c,
                                                                   EXACT_ADMITS_NO_HIGH: c}), site
            continue
        # lossless: the exact call stood aside; the default and lossless calls ran fused, or a fast path that does
        # not apply to these activations said why (one reason, both calls)
        assert site.reference_calls.get(EXACT_ADMITS_NO_LOSSLESS) == c, site
        ran = {k: v for k, v in site.reference_calls.items() if k != EXACT_ADMITS_NO_LOSSLESS}
        assert (site.fast_calls, ran) == (2 * c, {}) or (
            site.fast_calls == 0 and len(ran) == 1 and set(ran.values()) == {2 * c}), site
        if dtype == torch.bfloat16:  # every lossless path takes bf16 activations
            assert site.fast_calls == 2 * c, site


@every_family
def test_exact_never_runs_a_fused_op_and_the_default_tier_does(family, stand_in_kernels):
    builders = tiny(family)
    m = builders.transformer(dtype=torch.bfloat16)
    inputs = builders.inputs(m)
    reference = forward(m, inputs)
    quiet_apply(m)
    try:
        with accelpatch.quality("exact"):
            assert all_same(forward(m, inputs), reference)
        assert doubles.CALLS == {}
        quiet_apply(m, tier="exact")
        assert all_same(forward(m, inputs), reference) and doubles.CALLS == {}
        quiet_apply(m)  # the default tier again: the same bits, with the (stand-in) fused ops running
        assert all_same(forward(m, inputs), reference) and doubles.CALLS
    finally:
        accelpatch.remove(m)
    assert all_same(forward(m, inputs), reference)


# -- remove, save, copy, compile, train ------------------------------------------------------------------------------

@pytest.mark.parametrize("built,backend", with_and_without(SOL_FAMILIES), indirect=["built"])
def test_apply_twice_is_apply_once_and_remove_restores_bit_for_bit(model, backend):
    family, _, m, inputs, reference = model
    options = {} if backend is None else dict(SPARSE, tau=3.0)
    before = module_state(m)
    quiet_apply(m, **options)
    marks = {name: mod.__dict__.get(SITE_ATTR) for name, mod in m.named_modules()}
    hooks = module_state(m)["hooks"]
    quiet_apply(m, **options)  # idempotent: the same sites, no second layer of hooks
    assert {name: mod.__dict__.get(SITE_ATTR) for name, mod in m.named_modules()} == marks
    assert all(marks[path] is not None for path, _ in table_sites(family, m, backend))
    assert module_state(m)["hooks"] == hooks
    with accelpatch.quality("high"):
        forward(m, inputs)
    live = accelpatch.report(m)  # the patch was live: every site took its calls (Sol-Attn all of its modules')
    assert all(calls(s) for s in live.sites) if backend is None else sol_attn_runs(sol_sites(live)) > 0
    accelpatch.remove(m)
    accelpatch.remove(m)  # removing twice is harmless
    check_restored(m, before)
    assert all_same(forward(m, inputs), reference)


def _hashes(model, folder) -> dict:
    model.save_pretrained(folder)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@per_family("built")
def test_saved_files_never_change_and_load_to_the_unpatched_model(model, tmp_path):
    family, _, m, inputs, reference = model
    before = _hashes(m, tmp_path / "before")
    quiet_apply(m)
    patched = _hashes(m, tmp_path / "patched")
    accelpatch.remove(m)
    assert before == patched == _hashes(m, tmp_path / "after")
    unpatched = type(m).from_pretrained(tmp_path / "before").eval()
    reloaded = type(m).from_pretrained(tmp_path / "patched").eval()
    assert type(reloaded) is type(m) and accelpatch.report(reloaded).models == ()
    assert all_same(forward(reloaded, inputs), forward(unpatched, inputs))


@per_family("built")
def test_a_copy_a_pickle_and_a_compiled_graph_of_a_patched_model_keep_its_bits(model):
    family, _, m, inputs, reference = model
    quiet_apply(m)
    assert all_same(forward(m, inputs), reference)
    check_copies_keep_the_bits(m, inputs, reference, reference, counts(accelpatch.report(m, reset=True)))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(m, backend="eager")
        assert all_same(forward(compiled, inputs), reference)
        with accelpatch.quality("exact"):
            assert all_same(forward(compiled, inputs), reference)
    finally:
        torch._dynamo.reset()


@every_family
def test_training_gradients_are_the_unpatched_ones_also_with_gradient_checkpointing(family):
    builders = tiny(family)
    m = builders.transformer()
    inputs = builders.inputs(m, batch_size=1)
    modes = (False, True) if m._supports_gradient_checkpointing else (False,)

    def grads(checkpointing):
        m.train()
        m.zero_grad(set_to_none=True)
        (m.enable_gradient_checkpointing if checkpointing else m.disable_gradient_checkpointing)()
        try:
            torch.manual_seed(0)  # whatever is random in training mode (caption dropout) draws the same numbers
            sum(out.float().square().sum() for out in outputs(m(**inputs))).backward()
        finally:
            m.disable_gradient_checkpointing() if checkpointing else None
            m.eval()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    expected = {mode: grads(mode) for mode in modes}
    quiet_apply(m)
    try:
        for mode in modes:
            got = grads(mode)
            assert got and got.keys() == expected[mode].keys(), mode
            assert all(same_bits(got[n], expected[mode][n]) for n in got), mode
    finally:
        accelpatch.remove(m)


# -- the tiny pipeline -----------------------------------------------------------------------------------------------

@per_family("pipeline")
def test_two_pipelines_built_with_one_seed_are_one_pipeline_and_every_random_part_follows_it(pipeline):
    family, builders, pipe, reference = pipeline
    first, second = builders.pipeline(seed=0), builders.pipeline(seed=0)
    assert states_equal(module_bits(first), module_bits(pipe)) and states_equal(module_bits(first),
                                                                                module_bits(second))
    assert all_same(run_pipeline(family, builders, second), reference)
    other = module_bits(builders.pipeline(seed=1))
    assert not states_equal(module_bits(first), other)
    differs = {k.split(".")[0] for k, x in module_bits(first).items()
               if x.is_floating_point() and not torch.equal(x, other[k])}
    modules = {name for name, c in first.components.items() if isinstance(c, torch.nn.Module)}
    assert differs == modules, modules - differs


@per_family("pipeline")
def test_the_pipeline_gives_its_unpatched_outputs_at_the_default_tiers_and_after_remove(pipeline):
    family, builders, pipe, reference = pipeline
    assert all(torch.isfinite(out).all() for out in reference)
    forwards, unhook = transformer_forwards(pipe)
    quiet_apply(pipe)
    try:
        for tier in (None, "lossless", "exact"):
            with accelpatch.quality(tier) if tier else warnings.catch_warnings():
                assert all_same(run_pipeline(family, builders, pipe), reference), tier
        rep = accelpatch.report(pipe)
    finally:
        unhook()
        accelpatch.remove(pipe)
    assert rep.fallback_calls == {} and rep.fast_calls > 0  # the lossless paths ran in the default and lossless calls
    assert forwards[0] > 0 and forwards[0] % 3 == 0
    for site in rep.sites:  # the three calls asked every site alike: n times each
        n, rest = divmod(calls(site), 3)
        assert n and not rest and not site.fallback_calls, site
        if site.tier == "high":
            assert (site.fast_calls, site.reference_calls) == (0, {LOSSLESS_ADMITS_NO_HIGH: 2 * n,
                                                                   EXACT_ADMITS_NO_HIGH: n}), site
        else:
            assert site.reference_calls.get(EXACT_ADMITS_NO_LOSSLESS) == n, site
            ran = {k: v for k, v in site.reference_calls.items() if k != EXACT_ADMITS_NO_LOSSLESS}
            assert (site.fast_calls, ran) == (2 * n, {}) or (site.fast_calls == 0 and list(ran.values()) == [2 * n])
    assert all_same(run_pipeline(family, builders, pipe), reference)


@per_family("pipeline")
def test_the_bit_check_sees_a_one_ulp_change_of_the_pipelines_outputs(pipeline):
    reference = pipeline[3]
    for index, out in enumerate(reference):
        nudged = out.clone()
        flat = nudged.view(INT_VIEWS[out.dtype]).view(-1)
        flat[flat.numel() // 2] += 1
        changed = reference[:index] + (nudged,) + reference[index + 1:]
        assert not all_same(changed, reference) and all_same(tuple(o.clone() for o in reference), reference)


# -- Sol-Attn families -----------------------------------------------------------------------------------------------

@per_family("built", SOL_FAMILIES)
def test_sol_attn_exact_and_lossless_and_its_default_dense_layers_are_the_unpatched_bits(model):
    family, _, m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    assert accelpatch.report(m).models[0].default_tier == "high"
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert all_same(forward(m, inputs), reference), tier
    with pytest.warns(RuntimeWarning, match="never runs sparse"):  # layers 0 and 1 are dense: every layer here
        accelpatch.apply(m, backend="sol_attn", dense_steps=0, tau=3.0)
    assert all_same(forward(m, inputs), reference)
    sol = {s.path: s.reference_calls for s in sol_sites(accelpatch.report(m))}
    expected = {path for path, kind in table_sites(family, m, "sol_attn") if kind.endswith("sol_attn")}
    assert sol and set(sol) == expected
    assert all(reasons == {sol_attention.DENSE_LAYER: 1} for reasons in sol.values()), sol


@per_family("built", SOL_FAMILIES)
def test_a_kernel_that_raises_falls_back_warned_once_and_counted_and_strict_raises(model, monkeypatch):
    family, _, m, inputs, reference = model
    import accelpatch.sol_attn.op as ops

    raised = [0]

    def broken(*args, **kwargs):
        raised[0] += 1
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(ops, "sol_attn", broken)
    accelpatch.apply(m, **SPARSE)
    with pytest.warns(RuntimeWarning, match="kernel exploded") as record:
        first, again = forward(m, inputs), forward(m, inputs)
    assert len([w for w in record if "kernel exploded" in str(w.message)]) == 1  # one warning per reason
    assert all_same(first, reference) and all_same(again, reference)  # the fallback is the unpatched model's output
    assert raised[0] > 0 and accelpatch.report(m).fallback_calls == {"error: RuntimeError: kernel exploded": raised[0]}
    accelpatch.apply(m, **SPARSE, strict=True)
    assert accelpatch.report(m).models[0].strict
    with pytest.raises(FastPathUnavailableError, match="kernel exploded"):
        forward(m, inputs)
    with accelpatch.quality("exact"):
        assert all_same(forward(m, inputs), reference)


@per_family("built", SOL_FAMILIES)
def test_a_copy_and_a_pickle_keep_the_sparse_path(model):
    family, _, m, inputs, reference = model
    accelpatch.apply(m, **SPARSE, tau=2.0)
    sparse = forward(m, inputs)
    rep = accelpatch.report(m, reset=True)
    assert 0 < sol_attn_runs(sol_sites(rep)) == len(sol_sites(rep))  # each Sol-Attn site ran the op once
    check_copies_keep_the_bits(m, inputs, sparse, reference, counts(rep))


@every_sol_family
def test_gradients_flow_through_the_sparse_path_also_under_gradient_checkpointing(family):
    builders = tiny(family)
    m = builders.transformer()
    inputs = builders.inputs(m)
    accelpatch.apply(m, **SPARSE, tau=2.0)
    (site,) = sol_sites(accelpatch.report(m))[:1]
    module = m.get_submodule(site.path)  # the sparse path's q/k/v projections get their gradients through it

    def grads():
        m.zero_grad(set_to_none=True)
        sum(out.square().mean() for out in outputs(m(**inputs))).backward()
        return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    try:
        plain = grads()
        assert plain and all(torch.isfinite(g).all() for g in plain.values())
        assert sum(g.abs().sum() for g in plain.values()) > 0
        once = counts(accelpatch.report(m))
        assert sol_attn_runs(sol_sites(accelpatch.report(m))) == len(sol_sites(accelpatch.report(m)))
        m.enable_gradient_checkpointing()
        m.train()
        try:
            again = grads()
            assert again.keys() == plain.keys() and all(same_bits(again[n], plain[n]) for n in plain)
            twice = counts(accelpatch.report(m))  # the recomputation is not counted again
            assert twice == {k: (2 * f, {r: 2 * n for r, n in ref.items()}, {r: 2 * n for r, n in fb.items()})
                             for k, (f, ref, fb) in once.items()}
        finally:
            m.disable_gradient_checkpointing()
            m.eval()
    finally:
        accelpatch.remove(m)


@per_family("pipeline", SOL_FAMILIES)
def test_in_the_pipeline_dense_steps_short_sequences_and_exact_are_the_unpatched_bits_and_high_runs_sparse(
        pipeline, monkeypatch):
    family, builders, pipe, reference = pipeline
    import accelpatch.sol_attn.op as ops
    run = lambda: run_pipeline(family, builders, pipe)  # noqa: E731
    forwards, unhook = transformer_forwards(pipe)

    def dense_call(**options):
        """One call at high patched with ``options``, which keep every call dense: its outputs are the unpatched
        ones; the Sol-Attn sites, the latest call's dense steps and the transformer forwards."""
        accelpatch.apply(pipe, **options)
        accelpatch.report(pipe, reset=True)
        forwards[0] = 0
        assert all_same(run(), reference), options
        rep = accelpatch.report(pipe)
        return sol_sites(rep), rep.models[0].dense_steps, forwards[0]

    try:
        accelpatch.apply(pipe, **SPARSE)
        with accelpatch.quality("exact"):
            assert all_same(run(), reference)
        assert sol_sites(accelpatch.report(pipe)) and all(
            s.fast_calls == 0 for s in sol_sites(accelpatch.report(pipe)))
        # dense_steps=1.0 (all of this call's steps): every call a counted dense step
        sites, dense, n = dense_call(**dict(SPARSE, dense_steps=1.0))
        total = dense["total"]
        assert sites and total and n and not n % total, (dense, n)
        assert all(s.fast_calls == 0 and s.reference_calls == {DENSE_STEP: n} and not s.fallback_calls
                   for s in sites), (n, sites)
        assert dense == {"total": total, "steps": {i: {DENSE_STEP: len(sites) * n // total}
                                                   for i in range(total)}}
        # the defaults (dense_steps 0.2: the first 20 % of this call's steps rounded up; min_tokens 12,288): the
        # first steps are dense steps, and every later call is over a tiny sequence below the floor
        sites, dense, again = dense_call(backend="sol_attn", dense_layers="")
        head, per_step = -(-total // 5), n // total
        assert again == n and 0 < head < total and dense["total"] == total, (dense, again)
        assert all(s.fast_calls == 0 and not s.fallback_calls and s.reference_calls == {
            DENSE_STEP: head * per_step, SHORT_SEQUENCE: (total - head) * per_step} for s in sites), sites
        assert dense["steps"] == {i: {DENSE_STEP if i < head else SHORT_SEQUENCE: len(sites) * per_step}
                                  for i in range(total)}
        accelpatch.apply(pipe, **SPARSE)
        accelpatch.report(pipe, reset=True)
        forwards[0] = 0
        with accelpatch.quality("high"):
            out = run()
        sites, high_forwards = sol_sites(accelpatch.report(pipe)), forwards[0]
        real = ops.sol_attn

        def moved_kernel(*args, **kwargs):  # the sparse kernel's output, moved: the pipeline's must move with it
            attended, stats = real(*args, **kwargs)
            return attended + 1e-2, stats

        monkeypatch.setattr(ops, "sol_attn", moved_kernel)
        with accelpatch.quality("high"):
            moved = run()
        monkeypatch.undo()
    finally:
        unhook()
        accelpatch.remove(pipe)
    assert all(torch.isfinite(o).all() for o in out) and not all_same(moved, out)
    assert sites and all(s.fast_calls == high_forwards > 0 for s in sites), (high_forwards, sites)
    assert all(0 < s.stats["exact_fraction"] < 1 for s in sites), sites
    assert all_same(run(), reference)


@per_family("pipeline", SOL_FAMILIES)
def test_with_the_defaults_a_four_step_call_runs_sparse_on_every_step_after_the_first_except_dense_layers(pipeline):
    """The issue's acceptance: with the defaults, a 4-step call on each family's tiny pipeline with
    ``backend="sol_attn"`` (``min_tokens=0``: the tiny sequences are shorter than the floor) runs sparse on every step
    after the first, except dense layers. The default ``dense_steps`` (0.2: 1 of 4 steps) keeps step 0 dense at every
    Sol-Attn site; on steps 1-3 a site in the model's default dense layers runs dense (a dense layer) and every other
    site runs the Sol-Attn op on each call. Every tiny transformer's blocks (2) all lie in its default dense layers
    (0, 1): there apply() warns that nothing runs sparse and the call gives the unpatched bits; the same call with
    ``dense_layers=""`` (the default ``dense_steps`` still) runs the Sol-Attn op at every site on steps 1-3."""
    family, builders, pipe, _ = pipeline
    steps = 4 + (family.recipe.min_steps is not None)  # MiniMax-H3: n scheduler steps run n-1 transformer calls
    forwards, unhook = transformer_forwards(pipe)

    def call():
        accelpatch.report(pipe, reset=True)
        forwards[0] = 0
        out = outputs(pipe(**dict(pipeline_call(family, builders, pipe), num_inference_steps=steps)))
        return out, accelpatch.report(pipe), forwards[0]

    layers = sol_site_layers(family, pipe.transformer)
    dense_sites = {path for path, layer in layers.items() if layer in family.adapter_class().default_dense_layers}
    try:
        unpatched, _, n = call()
        per_step = n // 4
        assert layers and per_step and n == 4 * per_step, (layers, n)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelpatch.apply(pipe, backend="sol_attn", min_tokens=0)
        never = [w for w in caught if "never runs sparse" in str(w.message)]
        assert len(never) == (dense_sites == set(layers)), [str(w.message) for w in caught]
        out, rep, again = call()
        sites = sol_sites(rep)
        assert again == n and {s.path for s in sites} == set(layers)
        assert rep.models[0].dense_steps == {"total": 4, "steps": {
            0: {DENSE_STEP: len(layers) * per_step},
            **{i: {DENSE_LAYER: len(dense_sites) * per_step} for i in (1, 2, 3) if dense_sites}}}
        for s in sites:
            assert calls(s) == 4 * per_step and not s.fallback_calls, s
            if s.path in dense_sites:
                assert s.fast_calls == 0 and s.reference_calls == {DENSE_STEP: per_step, DENSE_LAYER: 3 * per_step}, s
            else:
                assert sol_attn_runs([s]) == 3 * per_step and set(s.reference_calls) <= {DENSE_STEP, NOTHING_SKIPPED}
                assert s.reference_calls[DENSE_STEP] == per_step, s
        if dense_sites == set(layers):  # no site runs sparse: every call is the model's own attention
            assert all_same(out, unpatched)
        # no dense layers, the default dense_steps: Sol-Attn at every site on steps 1-3 (that its output reaches the
        # pipeline's is the check above with the moved kernel)
        accelpatch.apply(pipe, backend="sol_attn", min_tokens=0, dense_layers="")
        out, rep, again = call()
        sites = sol_sites(rep)
        assert again == n and {s.path for s in sites} == set(layers)
        assert rep.models[0].dense_steps == {"total": 4, "steps": {0: {DENSE_STEP: len(layers) * per_step}}}
        assert all(calls(s) == 4 * per_step and not s.fallback_calls and sol_attn_runs([s]) == 3 * per_step
                   and s.reference_calls.get(DENSE_STEP) == per_step
                   and set(s.reference_calls) <= {DENSE_STEP, NOTHING_SKIPPED} for s in sites), sites
        assert all(torch.isfinite(o).all() for o in out)
        assert all(s.fast_calls and 0 < s.stats["exact_fraction"] < 1 for s in sites), sites  # blocks were skipped
    finally:
        unhook()
        accelpatch.remove(pipe)

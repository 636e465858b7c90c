"""A diffusers upgrade declines, it does not break (accelpatch.core.restated): every fast path that restates diffusers
code carries the fingerprints of that code for the tested diffusers versions; at ``apply`` a function whose code is
not one recorded (a new diffusers, an edited install, a function replaced at run time) declines that fast path by
name (report, one warning, strict raises), the model gives diffusers' own bits, and the other fast paths keep
working. The recorded data must match the installed diffusers, so it cannot rot."""
import ast
import inspect
import textwrap
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core import restated
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.testing import (sana_video_transformer_inputs, tiny_sana_video_transformer, tiny_wan_transformer,
                                wan_transformer_inputs)
from accelpatch.tools import fingerprints

#: every fast path that restates diffusers code (SANA-Video 2.0's are accelpatch's own model: they restate none)
RESTATING = {
    "fused_swiglu", "fused_gelu", "sana_video_fused_block", "sana_video_fused_glumb", "sana_video_fused_linear_attention",
    "sana_video_linear_attention", "wan_fused_block", "wan_fused_attention", "wan_sol_attn", "ltx2_fused_block",
    "ltx2_fused_attention", "ltx2_sol_attn", "hunyuan_video15_fused_block", "hunyuan_video15_fused_attention",
    "hunyuan_video15_sol_attn", "minimax_h3_fused_block", "minimax_h3_fused_attention", "sol_attn",
    "memory plan stand-in"}

SANA_PROCESSOR = "SanaLinearAttnProcessor3_0.__call__"
SANA_ATTENTION_KINDS = ("sana_video_fused_linear_attention", "sana_video_linear_attention")


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


#: the line a "newer diffusers" adds to a forward or processor: its output changes (exactly, a power of two), so a
#: fast path still running the old code would no longer give diffusers' bits
HALVED = "hidden_states = hidden_states * 0.5"


def changed_copy(function, tmp_path, line: str = HALVED):
    """``function`` with ``line`` added as the first statement of its body. Its source is a real file, so it is
    fingerprinted (not refused as unreadable)."""
    source = textwrap.dedent(inspect.getsource(function))
    lines = source.splitlines(keepends=True)
    first = ast.parse(source).body[0].body[0]
    at = first.lineno - 1 - (len(first.decorator_list) if hasattr(first, "decorator_list") else 0)
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at, f"{indent}{line}\n")
    path = tmp_path / f"changed_{function.__name__.strip('_')}.py"
    path.write_text("".join(lines))
    namespace = dict(function.__globals__)
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - a test double
    return namespace[function.__name__]


def test_the_recorded_fingerprints_match_the_installed_diffusers_for_every_restating_fast_path():
    paths = fingerprints.restating_paths()
    assert {kind for kinds in paths.values() for kind in kinds} == RESTATING
    assert sorted(paths) == sorted(restated.recorded()), "run python -m accelpatch.tools.fingerprints --write"
    differ = {name: restated.mismatch(name) for name in paths if restated.mismatch(name) is not None}
    assert not differ, differ
    assert fingerprints.main([]) == 0


def test_every_fast_path_guarded_by_a_diffusers_processor_declares_that_processor_restated():
    """A new fast path that checks for a diffusers processor restates its ``__call__``: it must say so, or a changed
    processor would not decline it."""
    from accelpatch.core.sites import FAST_PATH_CLASSES

    fingerprints.restating_paths()  # imports every adapter and site module
    checked = 0
    for cls in FAST_PATH_CLASSES:
        try:
            processor = object.__new__(cls).expected_processor()
        except NotImplementedError:  # an abstract base (its model's subclass says)
            continue
        if processor is None or not processor.__module__.startswith("diffusers."):
            continue
        checked += 1
        assert f"{processor.__module__}:{processor.__qualname__}.__call__" in cls.restates, cls
    assert checked >= 8, checked


def _documented():
    def forward(x):
        """Doc."""
        return x + 1  # a comment

    return forward


def _laid_out():
    def forward(x):
        return (x
                + 1)

    return forward


def _changed():
    def forward(x):
        return x + 2

    return forward


def test_a_fingerprint_ignores_docstrings_comments_and_layout_but_not_code():
    documented, laid_out, changed = (restated.source_fingerprint(f()) for f in (_documented, _laid_out, _changed))
    assert documented == laid_out != changed


def test_a_processor_whose_code_differs_is_declined_by_name_and_the_output_stays_diffusers(monkeypatch, tmp_path):
    from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

    monkeypatch.setattr(SanaLinearAttnProcessor3_0, "__call__",
                        changed_copy(SanaLinearAttnProcessor3_0.__call__, tmp_path))
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=1, seed=1)
    reference = _forward(model, inputs)  # diffusers' own code, as it now is
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelpatch.apply(model)
        out = _forward(model, inputs)
    assert torch.equal(out, reference)
    report = accelpatch.report(model)
    version = restated.diffusers_version()
    for kind in SANA_ATTENTION_KINDS:
        sites = [s for s in report.sites if s.kind == kind]
        assert sites and all(not s.mounted and s.fast_calls == 0 for s in sites), sites
        assert (f"diffusers {version}'s {SANA_PROCESSOR} differs from the code this fast path restates "
                f"(the {SANA_PROCESSOR} of diffusers {version} was replaced or edited in place)") in sites[0].reason
        assert "restore diffusers' own" in sites[0].reason
        said = [str(w.message) for w in caught if kind in str(w.message)]
        assert len(said) == 1 and SANA_PROCESSOR in said[0], said  # once, at apply; not again at the call
    # the block and GLUMB restate other, unchanged code: they mount and run their fused ops
    for kind in ("sana_video_fused_block", "sana_video_fused_glumb"):
        sites = [s for s in report.sites if s.kind == kind]
        assert sites and all(s.mounted and s.fast_calls == 1 for s in sites), sites
    accelpatch.remove(model)
    monkeypatch.undo()  # diffusers' code back: the same model mounts every path again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the high path's "no CUDA" on this machine
        accelpatch.apply(model)
    fused = [s for s in accelpatch.report(model).sites if s.kind == "sana_video_fused_linear_attention"]
    assert fused and all(s.mounted for s in fused)


def test_strict_mode_raises_naming_the_changed_function(monkeypatch, tmp_path):
    from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

    monkeypatch.setattr(SanaLinearAttnProcessor3_0, "__call__",
                        changed_copy(SanaLinearAttnProcessor3_0.__call__, tmp_path))
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=1, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(model, strict=True)
    with pytest.raises(FastPathUnavailableError, match=f"sana_video_fused_linear_attention .*{SANA_PROCESSOR}"):
        _forward(model, inputs)


def test_a_newer_diffusers_that_changed_a_block_forward_declines_only_that_path(monkeypatch, tmp_path):
    """What a user who upgrades diffusers sees: the changed block's fusion declines, naming the version, the tested
    ones and what to do; the self-attention fusion (unchanged code) and the step cache (no restated code) run."""
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    monkeypatch.setattr(restated, "diffusers_version", lambda: "9.0.0")
    monkeypatch.setattr(WanTransformerBlock, "forward", changed_copy(WanTransformerBlock.forward, tmp_path))
    model = tiny_wan_transformer(dtype=torch.bfloat16, num_layers=2)
    inputs = wan_transformer_inputs(model, num_frames=2, height=8, width=8)
    reference = _forward(model, inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelpatch.apply(model, cache="first_block")
        out = _forward(model, inputs)
    assert torch.equal(out, reference)
    tested = ", ".join(sorted(restated.recorded()[
        "diffusers.models.transformers.transformer_wan:WanTransformerBlock.forward"]))
    report = accelpatch.report(model)
    blocks = [s for s in report.sites if s.kind == "wan_fused_block"]
    assert blocks and all(not s.mounted for s in blocks)
    assert (f"diffusers 9.0.0's WanTransformerBlock.forward differs from the code this fast path restates "
            f"(tested: {tested}): it runs diffusers' own code; upgrade accelpatch, or install diffusers==") \
        in blocks[0].reason
    assert [str(w.message) for w in caught if "wan_fused_block" in str(w.message)] != []
    attention = [s for s in report.sites if s.kind == "wan_fused_attention"]
    assert attention and all(s.mounted and s.fast_calls == 1 for s in attention), attention
    cache = report.models[0].cache  # the step cache restates nothing: it runs (this one call computes)
    assert cache is not None and cache["computed"] == 1, cache


def test_a_newer_diffusers_whose_restated_code_is_unchanged_keeps_every_fast_path(monkeypatch):
    """The pin is open above the tested versions because of this: the version alone declines nothing."""
    monkeypatch.setattr(restated, "diffusers_version", lambda: "9.0.0")
    model = tiny_wan_transformer(dtype=torch.bfloat16, num_layers=2)
    accelpatch.apply(model)
    sites = accelpatch.report(model).sites
    assert sites and all(s.mounted for s in sites), [(s.kind, s.reason) for s in sites if not s.mounted]


def test_a_function_without_readable_source_is_declined_with_that_reason(monkeypatch):
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    namespace = dict(WanTransformerBlock.forward.__globals__)
    exec(textwrap.dedent(inspect.getsource(WanTransformerBlock.forward)), namespace)  # noqa: S102 - no file
    monkeypatch.setattr(WanTransformerBlock, "forward", namespace["forward"])
    reason = restated.mismatch("diffusers.models.transformers.transformer_wan:WanTransformerBlock.forward")
    assert reason is not None and "WanTransformerBlock.forward cannot be read" in reason, reason


def test_a_function_diffusers_no_longer_has_is_declined_by_name(monkeypatch):
    from diffusers.models.transformers import transformer_ltx2

    monkeypatch.delattr(transformer_ltx2, "apply_split_rotary_emb")
    reason = restated.mismatch("diffusers.models.transformers.transformer_ltx2:apply_split_rotary_emb")
    assert reason is not None and reason.startswith(f"diffusers {restated.diffusers_version()} has no "
                                                    "apply_split_rotary_emb"), reason


def test_the_writer_records_into_the_module_the_checks_read():
    """`python -m accelpatch.tools.fingerprints --write` once wrote a restated_fingerprints.py at the package's top,
    a file nothing read, after the data moved into accelpatch/core/."""
    from pathlib import Path

    import accelpatch.core.restated_fingerprints as data
    from accelpatch.tools import fingerprints

    assert fingerprints.DATA_FILE == Path(data.__file__).resolve()

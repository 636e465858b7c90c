"""The pytest plugin that patches every supported model at construction (accelpatch.testing.diffusers_tests_plugin)
and the script that runs diffusers' own model tests with and without it (accelpatch.testing.diffusers_tests).

Tiny pytest sessions run inline (pytester), so diffusers is imported once: a test in them builds a tiny Wan model
and must find it patched, with fused ops run and its output bit-identical to an unpatched twin built out here.
"""
import json

import diffusers  # noqa: F401 - imported out here: pytester drops modules an inline session imported, and
import pytest    # importing triton (which diffusers does) a second time in one process aborts it
import torch
import torch._dynamo  # noqa: F401 - same reason

from accelpatch.testing import WAN_TINY_CONFIG, tiny_wan_transformer, wan_transformer_inputs
from accelpatch.testing import diffusers_tests
from accelpatch.testing.diffusers_tests_plugin import NOTHING_PATCHED

pytest_plugins = ["pytester"]

PLUGIN = ["-p", "accelpatch.testing.diffusers_tests_plugin", "-p", "no:cacheprovider",
          "-W", "ignore::pytest.PytestAssertRewriteWarning"]

BUILDS_A_WAN_MODEL = f"""
import torch
import accelpatch
from accelpatch.core.gated_class import is_gated
from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs

def test_built_model_comes_out_patched():
    model = tiny_wan_transformer({WAN_TINY_CONFIG!r})
    assert is_gated(model.blocks[0]), type(model.blocks[0])
    assert accelpatch.report(model).sites
    with torch.no_grad():
        out = model(**wan_transformer_inputs(model, height=16, width=16)).sample
    assert accelpatch.report(model).fast_calls > 0
    torch.save(out, "patched_output.pt")
"""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _unpatched_output() -> torch.Tensor:
    """The same tiny model and inputs, built where no plugin runs: diffusers' own bits."""
    model = tiny_wan_transformer(WAN_TINY_CONFIG)
    assert type(model.blocks[0]).__name__ == "WanTransformerBlock"  # really unpatched
    with torch.no_grad():
        return model(**wan_transformer_inputs(model, height=16, width=16)).sample


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(_bits(a), _bits(b))


def test_a_model_built_under_the_plugin_is_patched_and_gives_diffusers_bits(pytester):
    pytester.makepyfile(test_inner=BUILDS_A_WAN_MODEL)
    summary_path = pytester.path / "summary.json"
    result = pytester.runpytest(*PLUGIN, f"--accelpatch-summary-json={summary_path}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*accelpatch plugin*",
                                 "models patched at construction: 1 (WanTransformer3DModel ×1) in 1 test(s), "
                                 "1 with patched modules*"])
    summary = json.loads(summary_path.read_text())
    assert summary["models_patched"] == 1 and summary["by_class"] == {"WanTransformer3DModel": 1}
    assert summary["fused_op_calls"] > 0, summary  # the fast path ran: bit identity below is not trivial
    patched = torch.load(pytester.path / "patched_output.pt")
    reference = _unpatched_output()
    assert _same_bits(patched, reference)
    # the check can fail: one ulp off in one element is caught
    perturbed = reference.clone()
    perturbed.view(-1)[0] = torch.nextafter(perturbed.view(-1)[0], torch.tensor(float("inf")))
    assert not _same_bits(patched, perturbed)
    # the plugin is gone after its session: a model built now is diffusers' own
    assert type(tiny_wan_transformer(WAN_TINY_CONFIG).blocks[0]).__name__ == "WanTransformerBlock"


BUILDS_A_NEW_WAN_FAMILY_MODEL = """
import torch
import accelpatch
from accelpatch.core.gated_class import is_gated
from accelpatch import testing

def test_built_model_comes_out_patched():
    model = getattr(testing, "tiny_{key}_transformer")(getattr(testing, "{config}"))
    assert is_gated(model.blocks[0]), type(model.blocks[0])
    with torch.no_grad():
        out = model(**getattr(testing, "{key}_transformer_inputs")(model, num_frames=3, height=16, width=16)).sample
    assert accelpatch.report(model).fast_calls > 0
    torch.save(out, "patched_output.pt")
"""


@pytest.mark.parametrize("key, config, model_class", [
    ("wan_vace", "WAN_VACE_TINY_CONFIG", "WanVACETransformer3DModel"),
    ("wan_animate", "WAN_ANIMATE_TINY_CONFIG", "WanAnimateTransformer3DModel")])
def test_wan_vace_and_wan_animate_models_built_under_the_plugin_are_patched_and_give_diffusers_bits(
        pytester, key, config, model_class):
    """#41: the families added after Wan are in the plugin's default ``--accelpatch-models`` by their registration."""
    from accelpatch import testing

    pytester.makepyfile(test_inner=BUILDS_A_NEW_WAN_FAMILY_MODEL.format(key=key, config=config))
    summary_path = pytester.path / "summary.json"
    result = pytester.runpytest(*PLUGIN, f"--accelpatch-summary-json={summary_path}")
    result.assert_outcomes(passed=1)
    summary = json.loads(summary_path.read_text())
    assert summary["by_class"] == {model_class: 1} and summary["fused_op_calls"] > 0, summary
    assert summary["apply_warnings"] == {} and summary["apply_refused"] == {}, summary
    model = getattr(testing, f"tiny_{key}_transformer")(getattr(testing, config))
    assert type(model.blocks[0]).__name__ == "WanTransformerBlock"  # unpatched out here
    with torch.no_grad():
        reference = model(**getattr(testing, f"{key}_transformer_inputs")(model, num_frames=3, height=16,
                                                                           width=16)).sample
    assert _same_bits(torch.load(pytester.path / "patched_output.pt"), reference)
    assert key in diffusers_tests.TEST_FILES


def test_a_session_that_patches_nothing_fails_unless_allowed(pytester):
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest(*PLUGIN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)
    assert NOTHING_PATCHED in result.stdout.str()
    allowed = pytester.runpytest(*PLUGIN, "--accelpatch-allow-unpatched")
    assert allowed.ret == pytest.ExitCode.OK


def test_an_unknown_model_name_is_a_usage_error(pytester):
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest(*PLUGIN, "--accelpatch-models=wan,flux")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("unknown model name(s) ['flux']; valid: wan, wan_vace, wan_animate, hunyuan_video15, ltx2"
            in result.stderr.str())


def _script_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        diffusers_tests.main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_the_script_names_what_it_expected(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert f"--diffusers-tests {missing}: no such directory" in _script_error(
        capsys, "--diffusers-tests", str(missing))
    assert f"is not a diffusers checkout: expected {tmp_path / 'tests' / 'models' / 'transformers'}" in \
        _script_error(capsys, "--diffusers-tests", str(tmp_path))
    (tmp_path / "tests" / "models" / "transformers").mkdir(parents=True)
    assert "pass the folder above it" in _script_error(capsys, "--diffusers-tests", str(tmp_path / "tests"))
    (tmp_path / diffusers_tests.TEST_FILES["wan"]).write_text("")
    err = _script_error(capsys, "--diffusers-tests", str(tmp_path), "--models", "wan,ltx2")
    assert f"missing test file(s) {tmp_path / diffusers_tests.TEST_FILES['ltx2']}" in err
    assert "wan.py" not in err.partition("missing")[2]
    assert "unknown model name(s) ['sd3']; valid: wan, wan_vace, wan_animate, hunyuan_video15, ltx2" in _script_error(
        capsys, "--diffusers-tests", str(tmp_path), "--models", "wan,sd3")


def test_the_comparison_flags_only_failures_new_with_accelpatch(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite>'
                   '<testcase classname="tests.models.transformers.test_models_transformer_wan.TestWan" name="a"/>'
                   '<testcase classname="tests.models.transformers.test_models_transformer_wan.TestWan" name="b">'
                   '<failure message="x"/></testcase>'
                   '<testcase classname="tests.models.transformers.test_models_transformer_wan.TestWan" name="c">'
                   '<skipped message="y"/></testcase>'
                   '</testsuite></testsuites>')
    unpatched = diffusers_tests.parse_junit(xml)
    wan = "tests.models.transformers.test_models_transformer_wan.TestWan"
    assert unpatched == {f"{wan}::a": "passed", f"{wan}::b": "failed", f"{wan}::c": "skipped"}
    files = [tmp_path / diffusers_tests.TEST_FILES["wan"]]
    lines, regressions = diffusers_tests.compare(files, unpatched, dict(unpatched))
    assert regressions == [] and "1/1/1" in lines[1]
    patched = {**unpatched, f"{wan}::a": "failed"}  # fails only with accelpatch: flagged
    lines, regressions = diffusers_tests.compare(files, unpatched, patched)
    assert regressions == [f"{wan}::a"]
    assert f"  {wan}::a: passed -> failed" in lines

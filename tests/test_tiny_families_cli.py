"""Every family the demo shows has a ``tiny:<name>`` pipeline for the CLI and a shipped tiny recipe (issue #30, item
7: ``tiny:wan``, HunyuanVideo 1.5 and LTX-2 were missing, so ``validate``/``bench`` could not run them offline).
Regression: each test here fails where those names are unknown."""
import json

import pytest

from accelpatch.__main__ import main
from accelpatch.recipes import TINY_MODELS, load_recipe
from accelpatch.tools import demo_sections
from accelpatch.eval.pipelines import load_pipeline

#: tiny name -> the diffusers pipeline class it builds and the outputs a call returns (HunyuanVideo 1.5's: diffusers'
#: class with its sequence lengths saved in its config, accelpatch.models.hunyuan_video15.pipeline)
NEW = {"wan": ("WanPipeline", ("frames",)), "hunyuan-video15": ("TinyHunyuanVideo15Pipeline", ("frames",)),
       "ltx2": ("LTX2Pipeline", ("frames", "audio"))}


def test_the_cli_and_the_demo_name_the_same_six_families():
    assert set(TINY_MODELS) == set(demo_sections.MODELS) and set(NEW) <= set(TINY_MODELS)


@pytest.mark.parametrize("name", sorted(NEW))
def test_tiny_names_build_their_pipeline_and_a_tensor_output_call(name):
    recipe = load_recipe(f"tiny-{name}-sol-attn")
    assert recipe.model == f"tiny:{name}" and recipe.backend == "sol_attn"
    loaded = load_pipeline(recipe)
    assert type(loaded.pipe).__name__ == NEW[name][0]
    assert loaded.call_kwargs["output_type"] == "pt" and "generator" not in loaded.call_kwargs
    assert {k: loaded.call_kwargs[k] for k in recipe.call} == recipe.call  # the recipe's call over the defaults


@pytest.mark.parametrize("name", sorted(NEW))
def test_validate_runs_the_tiny_recipe_offline_with_the_sparse_path(name, tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["validate", "--recipe", f"tiny-{name}-sol-attn", "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"tiny:{name} (random weights, fp32, cpu)" in text and "overall: PASS" in text
    assert f"{name.replace('-', '_')}_sol_attn x" in text  # the report names the sparse site kind that ran
    data = json.loads(out.read_text())
    assert data["passed"] and {c["label"]: c["passed"] for c in data["candidates"]} == {
        "lossless": True, "sol-attn-tau-0.5": True, "sol-attn-tau-2.0": True}


def test_bench_runs_a_new_tiny_recipe(capsys):
    assert main(["bench", "--recipe", "tiny-hunyuan-video15-sol-attn", "--rounds", "2", "--warmup", "0",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "tiny:hunyuan-video15 (random weights) on cpu (" in text and "float32" in text
    assert all(name in text for name in ("exact", "lossless", "sol-attn-tau-0.5", "sol-attn-tau-2.0"))

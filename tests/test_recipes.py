"""Recipes (schema, lookup, apply(recipe=...)) and the validate/bench/recipes command-line verbs."""
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

import accelpatch
from accelpatch import testing
from accelpatch.__main__ import main
from accelpatch.recipes import SHIPPED_RECIPES, Gates, RecipeError, available_recipes, load_recipe

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(SHIPPED_RECIPES.glob("*.yaml"))


def test_the_promised_recipes_ship_and_load():
    names = {p.stem for p in SHIPPED}
    assert {"sana-video-480p-high", "sana-video2-720p-high", "sana-video2-720p-middle", "minimax-h3-sol-attn",
            "tiny-sana-video", "tiny-sana-video2", "tiny-minimax-h3-sol-attn", "wan2.1-t2v-sol-attn",
            "wan2.1-t2v-1.3b-sol-attn"} <= names
    for path in SHIPPED:
        recipe = load_recipe(path)
        assert recipe.name == path.stem and recipe.description
        if not recipe.is_tiny:  # real-weight recipes must not pass by falling back
            assert recipe.gates.require_fast_path, path.name
    assert set(available_recipes()) >= names


@pytest.mark.parametrize("data, message", [
    ({"model": "tiny:sana-vidoe"}, "model: unknown tiny model 'tiny:sana-vidoe' (did you mean tiny:sana-video?)"),
    ({"model": "trained:ltx2"}, "model: unknown trained model 'trained:ltx2'; trained tiny models: "
                                "trained:sana-video, trained:sana-video2, trained:wan (the other families have "
                                "random-weight tiny:<model> pipelines only)"),
    # a family that trains but ships no trained folder yet is refused here, not when the recipe loads
    ({"model": "trained:hunyuan-video15"}, "model: unknown trained model 'trained:hunyuan-video15'; trained tiny "
                                           "models: trained:sana-video, trained:sana-video2, trained:wan"),
    ({"model": "m", "gates": {"ssim_flor": 0.9}}, "gates.ssim_flor: unknown field (did you mean 'ssim_floor'?); "
                                                   "allowed here: audio, audio_corr_floor, audio_lsd_ceiling, "
                                                   "audio_snr_floor, flicker_delta_max, i2v_image, motion_ratio_max, "
                                                   "motion_ratio_min, psnr_drift_max_db, psnr_floor, "
                                                   "require_fast_path, ssim_floor"),
    ({"model": "m", "gates": {"audio": "off", "audio_snr_floor": 5}},
     "gates: audio: off contradicts the audio gate(s) set: audio_snr_floor; drop them or set audio: auto/required"),
    ({"model": "m", "gates": {"audio": "on"}}, "gates.audio: Input should be 'auto', 'required' or 'off'"),
    ({"model": "m", "gates": {"audio_corr_floor": 1.5}}, "gates.audio_corr_floor: Input should be less than or "
                                                         "equal to 1"),
    ({"model": "m", "tier": "fast"}, "tier: unknown quality tier 'fast'; valid tiers are exact, lossless, high"),
    ({"model": "m", "dtype": "int8"}, "dtype: Input should be 'bf16', 'fp16' or 'fp32' (got 'int8')"),
    ({"model": "m", "backend": "sol"}, "backend: unknown backend 'sol'; backends: sol_attn"),
    ({"model": "m", "candidates": [{"tier": "high", "bakend": "sol_attn"}]},
     "candidates.0.bakend: unknown field (did you mean 'backend'?)"),
    ({"model": "m", "call": {"generator": 1}}, "call: give seeds (the 'seeds' field), not a generator"),
    ({"model": "m", "bench": {"rounds": 1}}, "bench.rounds: Input should be greater than or equal to 2"),
    # call values out of their range, for every family (the least steps named); seeds in torch's range
    ({"model": "tiny:sana-video", "call": {"num_inference_steps": 0}},
     "call: num_inference_steps must be an integer >= 1 (a run needs at least one denoising step), not 0"),
    ({"model": "tiny:sana-video2", "call": {"num_inference_steps": -3}}, "num_inference_steps must be an integer >= 1"),
    ({"model": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "call": {"num_inference_steps": 0}},
     "num_inference_steps must be an integer >= 1"),
    ({"model": "./some/hunyuan-folder", "call": {"num_inference_steps": 2.5}}, "must be an integer >= 1"),
    ({"model": "tiny:minimax-h3", "call": {"num_inference_steps": 0}},
     "call: num_inference_steps must be an integer >= 2 (MiniMax-H3's scheduler counts the final sigma 0 as one of "
     "the steps"),
    ({"model": "MiniMaxAI/MiniMax-H3", "call": {"num_inference_steps": 1}},
     "num_inference_steps must be an integer >= 2"),
    ({"model": "m", "call": {"num_frames": 0, "height": -64}},
     "call: num_frames must be an integer >= 1 (a number of frames), not 0; height must be an integer >= 1"),
    ({"model": "m", "seeds": [0, -1]}, "seeds: seed -1 is out of range: seeds are integers from 0 to 2**64-1"),
    ({"model": "m", "seeds": [2**64]}, "seeds: seed 18446744073709551616 is out of range"),
    ({"model": "m", "seeds": [4, 4]}, "seeds: seeds must be distinct, got [4] more than once"),
    ({"name": "x"}, "model: Field required"),
])
def test_schema_errors_name_the_field_and_what_is_allowed(data, message):
    with pytest.raises(RecipeError) as error:
        load_recipe({"name": "x", **data})
    assert message in str(error.value)


def test_call_values_in_range_load():
    assert load_recipe({"name": "x", "model": "tiny:minimax-h3", "call": {"num_inference_steps": 2}, "seeds": [0]})
    assert load_recipe({"name": "x", "model": "tiny:sana-video", "call": {"num_inference_steps": 1, "height": None},
                        "seeds": [2**64 - 1]})


def test_the_api_refuses_call_values_and_seeds_out_of_range_before_the_first_call():
    """validate/bench/tune called from Python check the same ranges before the first call; MiniMax-H3 is known by
    its scheduler (a ModularPipeline's class says nothing)."""
    from accelpatch.eval.preflight import check_call_arguments, check_seed, check_seeds

    class MiniMaxH3Scheduler:
        pass

    class Pipeline:
        def __init__(self, scheduler=None):
            self.scheduler = scheduler

        def __call__(self, num_inference_steps=50, height=64):
            raise AssertionError("not called")

    check_call_arguments(Pipeline(), {"num_inference_steps": 1}, "validate")
    with pytest.raises(ValueError, match=r"call_kwargs: num_inference_steps must be an integer >= 1 .*not 0"):
        check_call_arguments(Pipeline(), {"num_inference_steps": 0}, "validate")
    with pytest.raises(ValueError, match=r"num_inference_steps must be an integer >= 2 \(MiniMax-H3's"):
        check_call_arguments(Pipeline(MiniMaxH3Scheduler()), {"num_inference_steps": 1}, "bench")
    with pytest.raises(ValueError, match="height must be an integer >= 1"):
        check_call_arguments(Pipeline(), {"height": 0}, "bench")
    with pytest.raises(ValueError, match="seed -1 is out of range: seeds are integers from 0 to 2\\*\\*64-1"):
        check_seeds([0, -1])
    with pytest.raises(ValueError, match="seed -5 is out of range"):
        check_seed(-5)


def test_unknown_recipe_names_list_the_known_ones_and_bad_yaml_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"did you mean 'tiny-sana-video'\?.*known recipes: .*tiny-minimax-h3"):
        load_recipe("tiny-sana-vide")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(RecipeError, match="bad.yaml is not valid YAML"):
        load_recipe(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(RecipeError, match="must be a mapping of fields, got str"):
        load_recipe(scalar)


def test_your_own_recipes_are_searched_before_the_shipped_ones(tmp_path, monkeypatch, capsys):
    """#41: with the shipped recipes back in the repository's recipes/, a user's ./recipes and $ACCELPATCH_RECIPES
    folders are still searched first, in that order, and a recipe there with a shipped name wins."""
    from accelpatch.recipes import recipe_dirs

    mine, theirs = tmp_path / "recipes", tmp_path / "team"
    for folder, description in ((mine, "mine"), (theirs, "the team's")):
        folder.mkdir()
        for name in ("tiny-sana-video", f"only-{folder.name}"):
            (folder / f"{name}.yaml").write_text(yaml.safe_dump({"model": "tiny:sana-video",
                                                                 "description": description}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELPATCH_RECIPES", str(theirs))
    assert recipe_dirs() == [theirs, mine, SHIPPED_RECIPES]
    known = available_recipes()
    assert known["tiny-sana-video"] == theirs / "tiny-sana-video.yaml"
    assert load_recipe("tiny-sana-video").description == "the team's"
    assert load_recipe("only-recipes").description == "mine"
    assert known["tiny-minimax-h3-sol-attn"] == SHIPPED_RECIPES / "tiny-minimax-h3-sol-attn.yaml"
    assert main(["recipes"]) == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["only-recipes"] == str(mine / "only-recipes.yaml") and rows["tiny-minimax-h3-sol-attn"] == "shipped"


def test_apply_with_a_recipe_patches_with_its_backend_options_and_tier():
    model = testing.tiny_minimax_h3_transformer()
    accelpatch.apply(model, recipe="tiny-minimax-h3-sol-attn")
    report = accelpatch.report(model)
    assert report.models[0].backend == "sol_attn"
    assert accelpatch.current_quality(model) == "high"
    assert all(site.mounted for site in report.sites)
    # keyword arguments override the recipe's
    accelpatch.apply(model, recipe="tiny-minimax-h3-sol-attn", tier="lossless")
    assert accelpatch.current_quality(model) == "lossless"
    accelpatch.remove(model)
    assert accelpatch.current_quality(model) == "exact"


def test_apply_tier_sets_the_default_tier_and_is_validated():
    model = testing.tiny_sana_video_transformer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(model, tier="high")
    assert accelpatch.current_quality(model) == "high"
    assert "runs at tier high by default (apply(..., tier='high'))" in str(accelpatch.report(model))
    with accelpatch.quality("exact"):
        assert accelpatch.current_quality(model) == "exact"
    with pytest.raises(ValueError, match="unknown quality tier 'best'"):
        accelpatch.apply(model, tier="best")
    accelpatch.remove(model)


def _write(tmp_path, **fields) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny:sana-video", "dtype": "fp32", "device": "cpu",
                                    "call": {"num_inference_steps": 2}, **fields}))
    return path


def test_cli_validate_exit_codes_json_plot_and_frames(tmp_path, capsys):
    passing = _write(tmp_path, candidates=[{"tier": "lossless"}])
    out = tmp_path / "v.json"
    code = main(["validate", "--recipe", str(passing), "--json", str(out), "--plot", str(tmp_path / "p.png"),
                 "--frames", str(tmp_path / "f.png"), "--no-progress"])
    assert code == 0
    assert "overall: PASS" in capsys.readouterr().out
    assert json.loads(out.read_text())["passed"] is True
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "f.png").stat().st_size > 0
    # a gate built to fail: the high candidate must run a fast path, and on a CPU-only torch none can
    failing = _write(tmp_path, candidates=[{"tier": "high"}], gates={"require_fast_path": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["validate", "--recipe", str(failing), "--no-progress"]) == 1
    assert "overall: FAIL" in capsys.readouterr().out


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    # the recipe is read and checked before anything runs: a usage error (SystemExit 2), one line
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--recipe", "no-such-recipe"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpatch validate: error: no recipe file or known recipe named 'no-such-recipe'")
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--recipe", str(_write(tmp_path, tier="fast"))])
    assert exit_.value.code == 2
    assert "tier: unknown quality tier 'fast'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--recipe", str(_write(tmp_path)), "--rounds", "1", "--no-progress"])
    assert exit_.value.code == 2
    assert "argument --rounds: must be an integer >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate"])
    assert "--recipe" in capsys.readouterr().err


def test_cli_bench_writes_its_json_schema(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--recipe", str(_write(tmp_path, candidates=[{"tier": "lossless"}])), "--rounds", "2",
                 "--warmup", "0", "--json", str(out), "--no-progress"]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "accelpatch.bench" and data["baseline"] == "exact"
    assert [c["label"] for c in data["candidates"]] == ["exact", "lossless"]
    assert "vs exact" in capsys.readouterr().out


def test_cli_lists_recipes_and_help_does_not_import_torch():
    listing = subprocess.run([sys.executable, "-m", "accelpatch", "recipes"], capture_output=True, text=True,
                             cwd=REPO, check=True).stdout
    assert "tiny-minimax-h3-sol-attn" in listing and "MiniMaxAI/MiniMax-H3" in listing
    # #40: a header, and columns that hold their longest cell (a hub id overflowed the model column)
    lines = listing.splitlines()
    assert lines[0].endswith("recipes (use one: --recipe NAME, or accelpatch.apply(pipe, recipe=NAME)):")
    header = lines[1]
    assert header.split() == ["recipe", "model", "where", "description"]
    starts = [header.index(word) for word in ("model", "where", "description")]
    for line in lines[2:]:
        assert all(line[start - 2:start] == "  " and line[start] != " " for start in starts), line
    probe = ("import sys; from accelpatch.__main__ import main\n"
             "try:\n    main(['validate', '--help'])\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip().endswith("False")


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("command, option", [("validate", "--json"), ("validate", "--plot"),
                                             ("validate", "--frames"), ("bench", "--json")])
def test_cli_output_paths_are_checked_before_anything_runs(tmp_path, capsys, monkeypatch, command, option):
    from accelpatch.eval import pipelines

    monkeypatch.setattr(pipelines, "load_pipeline", lambda recipe: pytest.fail("nothing may run before the check"))
    recipe = str(_write(tmp_path))
    missing = tmp_path / "no" / "such" / "dir" / "out.file"
    with pytest.raises(SystemExit) as exit_:
        main([command, "--recipe", recipe, option, str(missing), "--no-progress"])
    assert exit_.value.code == 2  # a usage error, not 1 ("a gate failed")
    assert _one_error_line(capsys) == (f"accelpatch {command}: error: {option} {missing}: folder "
                                       f"{str(missing.parent)!r} does not exist")
    with pytest.raises(SystemExit):
        main([command, "--recipe", recipe, option, str(tmp_path), "--no-progress"])
    assert _one_error_line(capsys).endswith(f"{option} {tmp_path}: is a folder; give a file name")


def test_cli_a_device_torch_does_not_know_is_one_line_with_the_valid_choices(tmp_path, capsys):
    assert main(["validate", "--recipe", str(_write(tmp_path, device="tpu")), "--no-progress"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("accelpatch validate: error: device 'tpu' is not a device name (did you mean 'cpu'?); valid here: "
                           "auto, cpu")
    assert "mkldnn" not in line  # not torch's list of every device type it knows


def test_cli_a_misspelled_call_argument_is_refused_before_the_first_call(tmp_path, capsys):
    # SANA-Video's pipeline takes `frames`; `num_frame` would raise inside diffusers (a modular pipeline drops it)
    path = _write(tmp_path, call={"num_inference_steps": 2, "frame": 9}, candidates=[{"tier": "lossless"}])
    assert main(["validate", "--recipe", str(path), "--no-progress"]) == 2
    line = _one_error_line(capsys)
    assert "SanaVideoPipeline does not take the call argument(s) 'frame' (did you mean 'frames'?)" in line
    assert "it takes: " in line and "num_inference_steps" in line


def test_audio_gates_given_in_a_recipe_are_explicit_and_the_defaults_are_not(tmp_path):
    """Only thresholds written in the recipe ask for audio (and are refused on a pipeline without it); the
    defaults gate audio wherever a pipeline returns some."""
    default = load_recipe({"name": "x", "model": "m"})
    assert not default.gates.audio_required and default.gates.gates_audio
    assert (default.gates.audio_snr_floor, default.gates.audio_corr_floor, default.gates.audio_lsd_ceiling) == \
        (10.0, 0.95, None)
    path = _write(tmp_path, gates={"audio_snr_floor": 12.0, "ssim_floor": 0.9})
    asked = load_recipe(path).gates
    assert asked.audio_required and asked.explicit_audio_gates() == ["audio_snr_floor"]
    assert not load_recipe(_write(tmp_path, gates={"ssim_floor": 0.9})).gates.audio_required
    restated = Gates(**{**Gates().model_dump(), "ssim_floor": 0.9})  # the defaults written out: no request
    assert not restated.audio_required and restated.explicit_audio_gates() == []
    assert load_recipe(_write(tmp_path, gates={"audio": "required"})).gates.audio_required


def test_cli_validate_refuses_recipe_audio_gates_on_a_pipeline_without_audio(tmp_path, capsys):
    path = _write(tmp_path, candidates=[{"tier": "lossless"}], gates={"audio_corr_floor": 0.9})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["validate", "--recipe", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert ("gates ask for audio gates (audio_corr_floor=0.9), but SanaVideoPipeline returned no audio (on the first "
            "reference call)") in err


def test_a_trained_model_recipe_loads_the_shipped_pipeline_with_its_call_over_the_training_size():
    """``trained:<family>`` (issue #43): the shipped trained tiny pipeline, at its training size, the recipe's prompt
    and call arguments over it; one CPU thread, as for the random tiny models, and not called random."""
    from diffusers import SanaVideoPipeline

    from accelpatch.eval.pipelines import load_pipeline
    from accelpatch.recipes import Recipe

    recipe = Recipe(name="r", model="trained:sana-video", dtype="fp32", device="cpu",
                    call={"prompt": "a blue circle grows", "num_inference_steps": 3, "guidance_scale": 2.0})
    assert recipe.is_tiny and not recipe.is_random
    loaded = load_pipeline(recipe)
    assert isinstance(loaded.pipe, SanaVideoPipeline) and loaded.pipe.transformer.config.attention_head_dim == 112
    kwargs = loaded.call_kwargs
    assert (kwargs["prompt"], kwargs["num_inference_steps"], kwargs["guidance_scale"]) == ("a blue circle grows", 3, 2.0)
    assert (kwargs["height"], kwargs["width"], kwargs["frames"], kwargs["max_sequence_length"]) == (128, 256, 13, 16)
    assert "generator" not in kwargs and "trained tiny weights" in loaded.description

"""The command line (`python -m accelpatch`): --version, --help without torch, one-line argument errors.

Everything runs in-process through `accelpatch.__main__.main` except the import checks, which need a fresh
interpreter (torch is already imported here). The demo itself is run by tests/test_demo.py, not here."""
import importlib
import os
import subprocess
import sys
import tempfile

import pytest

import accelpatch
from accelpatch.__main__ import main
from accelpatch.tools import demo


def usage_error(capsys, argv):
    """Run main(argv), expect argparse's usage error (exit 2); return the `error:` line of stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err
    return errors[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"accelpatch {accelpatch.__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["memory", "--help"]])
def test_help_imports_neither_torch_nor_diffusers(argv):
    code = (
        "import sys\n"
        "from accelpatch.__main__ import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print('torch' in sys.modules, 'diffusers' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: accelpatch" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "False False"


def test_python_dash_m_version():
    result = subprocess.run([sys.executable, "-m", "accelpatch", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"accelpatch {accelpatch.__version__}"


@pytest.mark.parametrize("option,value,minimum", [
    ("--steps", "0", 1), ("--steps", "-2", 1), ("--steps", "two", 1), ("--steps", "1.5", 1),
    ("--repeats", "0", 1), ("--repeats", "-1", 1),
    ("--seed", "-1", 0),
])
def test_integer_options_reject_out_of_range_values(capsys, option, value, minimum):
    line = usage_error(capsys, ["demo", option, value])
    assert line == f"accelpatch demo: error: argument {option}: must be an integer >= {minimum}, got '{value}'"


def test_integer_option_types_accept_their_range():
    assert demo.positive_int("1") == 1 and demo.positive_int("12") == 12
    assert demo.non_negative_int("0") == 0


def test_device_cuda_without_cuda_is_a_usage_error(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(demo, "run_demo", lambda **kw: pytest.fail("the demo must not start"))
    line = usage_error(capsys, ["demo", "--device", "cuda", "--no-progress"])
    assert line.startswith("accelpatch demo: error: --device cuda: CUDA is not available")
    assert "valid here: cpu" in line


def test_device_nonsense_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(demo, "run_demo", lambda **kw: pytest.fail("the demo must not start"))
    line = usage_error(capsys, ["demo", "--device", "nonsense"])
    assert line.startswith("accelpatch demo: error: --device nonsense: not a torch device string")
    assert "valid here: cpu" in line


def test_device_cpu_passes_the_check():
    assert demo.device_error("cpu") is None


@pytest.mark.parametrize("error", [ValueError("bad\nvalue"), accelpatch.AccelpatchError("no fast path")])
def test_command_errors_are_one_line(capsys, monkeypatch, error):
    def failing(**kwargs):
        raise error

    monkeypatch.setattr(demo, "run_demo", failing)
    assert main(["demo", "--no-progress"]) == 2
    captured = capsys.readouterr()
    flat = " ".join(str(error).split())
    assert captured.err == f"accelpatch demo: error: {flat}\n"  # argparse's own prefix for a subcommand's errors


def test_ctrl_c_ends_a_command_in_one_line_with_exit_code_130(capsys, monkeypatch):
    """#40: Ctrl-C printed a 68-99-line traceback."""
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_demo", interrupted)
    assert main(["demo", "--no-progress"]) == 130
    assert capsys.readouterr().err.strip() == "accelpatch demo: interrupted"


@pytest.mark.parametrize("command", ["validate", "bench", "tune"])
def test_every_recipe_command_states_its_exit_codes(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "2 a usage or recipe error" in text and "130 interrupted" in text


def test_other_command_errors_keep_their_traceback(monkeypatch):
    def failing(**kwargs):
        raise KeyError("unexpected")

    monkeypatch.setattr(demo, "run_demo", failing)
    with pytest.raises(KeyError, match="unexpected"):
        main(["demo", "--no-progress"])


def test_arguments_reach_the_demo(monkeypatch, capsys):
    seen = {}

    def fake_run_demo(emit, **kwargs):
        seen.update(kwargs)
        emit("header")  # the demo prints through emit as it goes (the header first), not all at the end
        emit("section")
        return "header\nsection"

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.setattr("torch.set_num_threads", lambda n: None)
    assert main(["demo", "--steps", "2", "--repeats", "1", "--seed", "0", "--dtype", "fp32", "--no-progress"]) == 0
    assert seen == dict(steps=2, dtype="fp32", device="cpu", seed=0, repeats=1, progress=False,
                        model=("sana-video", "minimax-h3"), videos_dir="out/demo")
    assert capsys.readouterr().out == "header\nsection\n"
    assert main(["demo", "--videos", "elsewhere", "--no-progress"]) == 0 and seen["videos_dir"] == "elsewhere"
    assert main(["demo", "--no-videos", "--no-progress"]) == 0 and seen["videos_dir"] is None


def test_build_kernels_builds_or_loads_and_says_where(capsys, monkeypatch):
    """`build-kernels` readies the CPU kernels (here: loads the suite's cached build) and names the cache; with the
    kernels switched off it says how to switch them on, exit code 1."""
    from accelpatch.lossless.kernels import cpu_build

    monkeypatch.delenv(cpu_build.SWITCH, raising=False)
    assert main(["build-kernels"]) == 0
    out = capsys.readouterr().out
    assert "ready" in out and "accelpatch_cpu" in out and str(cpu_build.cache_root()) in out
    monkeypatch.setenv(cpu_build.SWITCH, "0")
    assert main(["build-kernels"]) == 1
    assert "switched off (ACCELPATCH_CPU_KERNELS=0): unset ACCELPATCH_CPU_KERNELS" in capsys.readouterr().out


# --- validate / bench / tune: what needs no model is refused before any model is built ------------------------

def _write_recipe(tmp_path, model="tiny:sana-video", **fields):
    import yaml

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model": model, "dtype": "fp32", "device": "cpu",
                                    "call": {"num_inference_steps": 2}, **fields}))
    return str(path)


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test when a command gets as far as loading its recipe's pipeline (or any model)."""
    from accelpatch.eval import pipelines, recipe_cli

    fail = lambda *a, **k: pytest.fail("a model was built for an argument that needs none")  # noqa: E731
    monkeypatch.setattr(recipe_cli, "_load", fail)
    monkeypatch.setattr(pipelines, "load_pipeline", fail)


OUT = os.path.join(tempfile.gettempdir(), "accelpatch-test-cli-tuned.yaml")  # only its folder is checked
EARLY_REFUSALS = [
    (["bench", "--recipe", "tiny-sana-video", "--rounds", "1"],
     "accelpatch bench: error: argument --rounds: must be an integer >= 2 (a spread needs two samples; a verdict "
     "six), got '1'"),
    (["bench", "--recipe", "tiny-sana-video", "--warmup", "-2"],
     "accelpatch bench: error: argument --warmup: must be an integer >= 0, got '-2'"),
    (["bench", "--recipe", "tiny-sana-vide"],
     "accelpatch bench: error: no recipe file or known recipe named 'tiny-sana-vide' (did you mean "
     "'tiny-sana-video'?)"),
    (["validate", "--recipe", "tiny-sana-vide"], "accelpatch validate: error: no recipe file or known recipe named"),
    (["validate", "--recipe", "tiny-sana-video", "--seeds", "-1"],
     "accelpatch validate: error: argument --seeds: seed -1 is out of range: seeds are integers from 0 to 2**64-1"),
    (["validate", "--recipe", "tiny-sana-video", "--seeds", "3", "3"],
     "accelpatch validate: error: --seeds: seeds must be distinct, got [3] more than once"),
    (["tune", "--recipe", "tiny-sana-video-step-cache", "--out", OUT, "--space", "{cache_treshold: [0.1, 0.2]}"],
     "accelpatch tune: error: --space: unknown knob 'cache_treshold' (did you mean 'cache_threshold'?); tune's "
     "knobs: cache_threshold,"),
    (["tune", "--recipe", "tiny-sana-video-step-cache", "--out", OUT, "--rounds", "0"],
     "accelpatch tune: error: argument --rounds: must be an integer >= 2"),
    (["tune", "--recipe", "tiny-sana-video-step-cache", "--out", OUT, "--seeds", "-1"],
     "accelpatch tune: error: argument --seeds: seed -1 is out of range"),
    (["tune", "--recipe", "tiny-sana-video-step-cache", "--out", OUT, "--held-out-seeds", "0"],
     "accelpatch tune: error: --held-out-seeds must not overlap the search seeds [0]"),
    (["tune", "--recipe", "tiny-sana-vide", "--out", OUT],
     "accelpatch tune: error: no recipe file or known recipe named 'tiny-sana-vide'"),
    (["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", "--budget", "x"],
     "accelpatch memory: error: budget 'x' is not a size"),
    (["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", "--gguf", "no-such-file.gguf"],
     "accelpatch memory: error: --gguf: no file at 'no-such-file.gguf'"),
]


@pytest.mark.parametrize("argv, message", EARLY_REFUSALS, ids=[" ".join(x for x in a if x not in (OUT, "--out", "--recipe")) for a, _ in EARLY_REFUSALS])
def test_arguments_that_need_no_model_are_refused_before_any_model_is_built(capsys, nothing_built, argv, message):
    line = usage_error(capsys, argv + ["--no-progress"])
    assert line.startswith(message), line


@pytest.mark.parametrize("model, steps, least", [("tiny:sana-video", 0, 1), ("tiny:sana-video2", 0, 1),
                                                 ("tiny:minimax-h3", 0, 2), ("tiny:minimax-h3", 1, 2)])
def test_a_recipe_call_out_of_range_is_refused_with_the_range_before_any_model(tmp_path, capsys, nothing_built,
                                                                               model, steps, least):
    recipe = _write_recipe(tmp_path, model, call={"num_inference_steps": steps})
    for command in (["validate"], ["bench"], ["tune", "--out", str(tmp_path / "t.yaml")]):
        line = usage_error(capsys, command + ["--recipe", recipe, "--no-progress"])
        assert f"call: num_inference_steps must be an integer >= {least} (" in line and f"not {steps}" in line


def test_early_refusals_import_no_torch(tmp_path):
    """The refusals above come before torch is imported: seconds, not the 7-136 s of building a model first."""
    cases = [argv for argv, _ in EARLY_REFUSALS] + [
        ["validate", "--recipe", _write_recipe(tmp_path, "tiny:minimax-h3", call={"num_inference_steps": 0})]]
    code = ("import sys\n"
            "from accelpatch.__main__ import main\n"
            f"for argv in {cases!r}:\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 2, (argv, exc.code)\n"
            "    else:\n"
            "        raise AssertionError(f'not refused: {argv}')\n"
            "print('torch' in sys.modules, 'diffusers' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False False"


def test_bench_help_names_the_interval_it_computes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "bootstrap" not in text  # accelpatch.eval.stats: order statistics of the per-round ratios
    assert "distribution-free 95% interval from order statistics" in text


def test_bench_header_says_device_and_dtype_once(tmp_path, capsys, monkeypatch):
    """Not "on cpu (cpu)" (platform.processor() is often empty on Linux), and the recipe's description does not
    repeat what the header measured."""
    import platform

    bench = importlib.import_module("accelpatch.eval.bench")  # the module (accelpatch.eval.bench is also the function)

    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(bench, "_cpu_name", lambda: "")
    recipe = _write_recipe(tmp_path, candidates=[{"tier": "lossless"}])
    assert main(["bench", "--recipe", recipe, "--rounds", "2", "--warmup", "0", "--no-progress"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("accelpatch bench: recipe recipe: tiny:sana-video (random weights) on cpu, float32, torch "
                           "threads 1 on "), head  # the timing's conditions follow the device (#40)
    assert head.count("cpu") == 1 and head.count("float32") + head.count("fp32") == 1, head

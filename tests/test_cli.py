"""The command line (`python -m accelpatch`): --version, --help without torch, one-line argument errors.

Everything runs in-process through `accelpatch.__main__.main` except the import checks, which need a fresh
interpreter (torch is already imported here). The demo itself is run by tests/test_demo.py, not here."""
import subprocess
import sys

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


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"]])
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
    assert captured.err == f"accelpatch: error: {flat}\n"


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
                        model=("sana-video", "minimax-h3"))
    assert capsys.readouterr().out == "header\nsection\n"


def test_build_kernels_builds_or_loads_and_says_where(capsys, monkeypatch):
    """`build-kernels` readies the CPU kernels (here: loads the suite's cached build) and names the cache; with the
    kernels switched off it says how to switch them on, exit code 1."""
    from accelpatch.ops.fused import cpu_build

    monkeypatch.delenv(cpu_build.SWITCH, raising=False)
    assert main(["build-kernels"]) == 0
    out = capsys.readouterr().out
    assert "ready" in out and "accelpatch_cpu" in out and str(cpu_build.cache_root()) in out
    monkeypatch.setenv(cpu_build.SWITCH, "0")
    assert main(["build-kernels"]) == 1
    assert "switched off (ACCELPATCH_CPU_KERNELS=0): unset ACCELPATCH_CPU_KERNELS" in capsys.readouterr().out

"""The README's two commands: `make demo` installs only what the demo needs, `make test` adds the dev extra, a
second run installs nothing, an edited setup.cfg installs again, and CI runs the README's test command.

Everything here is `make -n` (print, don't run) against a venv path in a temporary folder: nothing is installed,
and the repository's own .venv and files are left alone.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def dry_run(target: str, venv: Path, *args: str) -> str:
    """What `make -n TARGET` would run, with the venv at ``venv``."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "PYTEST_ARGS", "USE_UV")}
    done = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), target, f"VENV={venv}", *args], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def stamp(venv: Path, *names: str) -> None:
    """Make the stamp files, newer than every input (Makefile, setup.cfg, setup.py)."""
    venv.mkdir(parents=True, exist_ok=True)
    inputs = max((REPO / name).stat().st_mtime for name in ("Makefile", "setup.cfg", "setup.py"))
    for name in names:
        path = venv / name
        path.touch()
        when = max(inputs, path.stat().st_mtime) + 1
        os.utime(path, (when, when))


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:12])
    assert re.search(r"^make demo\s+#", head, re.M) and re.search(r"^make test\s+#", head, re.M)
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^stage \d+ make test\s*(#.*)?$", ci, re.M)


def test_each_ci_stage_has_a_wall_clock_limit_and_says_when_it_runs_out():
    """.ci/run runs every command as a stage with a limit (together under CI's 30 minutes); a stage that runs out is
    stopped, with its children, and named."""
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd ", "source "))]
    limits = [int(re.fullmatch(r"stage (\d+) make [a-z-]+\s*(#.*)?", line).group(1)) for line in commands]
    assert len(limits) == 3 and sum(limits) < 30 * 60, commands
    script = f"source {REPO / '.ci' / 'stage.sh'}; stage 1 bash -c 'sleep 60 & wait'; echo not reached"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=40)
    assert done.returncode == 124 and "not reached" not in done.stdout, (done.stdout, done.stderr)
    assert "CI stage 'bash -c sleep 60 & wait' ran out of its 1 s limit" in done.stderr
    done = subprocess.run(["bash", "-c", f"source {REPO / '.ci' / 'stage.sh'}; stage 5 false; echo not reached"],
                          capture_output=True, text=True, timeout=40)
    assert done.returncode == 1 and "CI stage 'false' failed (exit status 1)" in done.stderr


@needs_make
def test_demo_installs_accelpatch_without_the_dev_extra(tmp_path):
    plan = dry_run("demo", tmp_path / "venv")
    assert "uv pip install" in plan and "pip install" in plan  # uv, with pip as the fallback
    assert '-e "."' in plan and ".[dev]" not in plan
    assert plan.rstrip().splitlines()[-1].endswith("-m accelpatch demo")


@needs_make
def test_test_installs_the_dev_extra_and_takes_pytest_args(tmp_path):
    plan = dry_run("test", tmp_path / "venv", "PYTEST_ARGS=tests/test_tiers.py")
    assert '-e ".[dev]"' in plan
    assert plan.rstrip().splitlines()[-1].endswith("-m pytest -q tests/test_tiers.py")


@needs_make
def test_a_second_run_installs_nothing(tmp_path):
    venv = tmp_path / "venv"
    stamp(venv, ".tools", ".installed-demo", ".installed")
    for target, last in (("demo", "-m accelpatch demo"), ("test", "-m pytest -q -n 2 --dist loadfile tests")):
        plan = dry_run(target, venv).strip().splitlines()
        assert len(plan) == 1 and plan[0].endswith(last), plan


@needs_make
def test_after_make_test_the_demo_needs_nothing_more_but_after_the_demo_make_test_installs(tmp_path):
    venv = tmp_path / "venv"
    stamp(venv, ".tools", ".installed-demo")
    assert len(dry_run("demo", venv).strip().splitlines()) == 1
    assert '-e ".[dev]"' in dry_run("test", venv)


@needs_make
def test_an_edited_setup_cfg_installs_again(tmp_path):
    venv = tmp_path / "venv"
    stamp(venv, ".tools", ".installed-demo", ".installed")
    # -W: as if setup.cfg had just been edited (its mtime is left alone)
    assert '-e "."' in dry_run("demo", venv, "-W", "setup.cfg")
    assert '-e ".[dev]"' in dry_run("test", venv, "-W", "setup.cfg")


@needs_make
def test_ci_builds_the_docs_strictly_with_the_dev_extras_tools(tmp_path):
    """`make docs` is `mkdocs build --strict` in the test venv (the dev extra holds the tools); CI runs it after
    `make test`."""
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^stage \d+ make test\s*(#.*)?\nstage \d+ make docs\s*(#.*)?$", ci, re.M), ci
    plan = dry_run("docs", tmp_path / "venv")
    assert '-e ".[dev]"' in plan
    assert plan.rstrip().splitlines()[-1].endswith("-m mkdocs build --strict -d site")
    setup_cfg = (REPO / "setup.cfg").read_text()
    dev = setup_cfg[setup_cfg.index("\ndev =") : setup_cfg.index("\n[", setup_cfg.index("\ndev ="))]
    for tool in ("mkdocs>=", "mkdocs-material>=", "mkdocstrings[python]>="):
        assert f"\n    {tool}" in dev, tool


@needs_make
def test_ci_runs_the_smoke_subset_on_the_oldest_torch_from_a_venv_outside_the_clone(tmp_path):
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^stage \d+ make test-oldest\s*(#.*)?$", ci, re.M)
    plan = dry_run("test-oldest", tmp_path / "venv", f"OLDEST_VENV={tmp_path / 'oldest'}")
    assert "torch==2.11.0 triton==3.6.0" in plan and "exit 1" in plan  # installs, and fails loudly when it cannot
    lines = plan.replace("\\\n", " ").rstrip().splitlines()  # one line per command (make -n keeps the \\-breaks)
    run = next(line for line in lines if " -m pytest " in line)
    assert f"PYTHONPATH={REPO}" in plan and "TRITON_INTERPRET=1" in plan and str(tmp_path / "oldest") in plan
    for smoke in ("test_tiers.py", "test_lossless_bit_identity.py", "test_compile.py", "test_sol_attn_triton.py",
                  "test_fused_triton.py"):
        assert smoke in run, smoke
    # then the GPU day's one command, rehearsed as a dry run on that torch in an image-shaped environment
    assert lines[-1] == f"PYTHON={tmp_path / 'oldest' / 'bin' / 'python'} benchmarks/gpu/rehearse.sh --dry-run"
    assert lines.index(run) < len(lines) - 1
    setup_cfg = (REPO / "setup.cfg").read_text()
    assert re.search(r"^\s+torch>=2\.11\s*$", setup_cfg, re.M)  # the oldest tested torch is the promised floor

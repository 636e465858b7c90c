"""CONTRIBUTING.md's recipes hold: every ```` ```python ```` block in it is run or checked here, so that a worked
example cannot go stale (#41).

How a block is taken (CONTRIBUTING's "Code fences" paragraph says the same to its readers):

* a block whose first line is ``# module accelpatch.x.y`` (or ``# package accelpatch.x.y``) is a new file of a worked
  example: it is written to a temporary folder as that module's file (``x/y.py`` in a folder ``accelpatch``;
  ``x/y/__init__.py`` for a package), and that folder joins the ``__path__`` of the deepest package of the
  repository on its way, before the other blocks of its section run, as if the file were in the repository (it must
  not name a module the repository has);
* a block right below an HTML comment ``<!-- not executed: REASON -->`` is not run; only the reasons listed in
  :data:`NOT_EXECUTED` may be given, and a reason ``excerpt of PATH`` makes the block an excerpt of that repository
  file: its lines, comments aside and ``...`` standing for lines left out, must be lines of the file, in order;
* every other block runs: the blocks of one ``##`` section in order, in one fresh Python process per section, each
  block in a fresh namespace (as a reader copies it), in a temporary working directory, with ``tests/`` on the path.

The sections with a recipe ("Adding a model", "Adding a lossless fused op", "Adding a `high` fast path", and one about
adding a feature once it is written) must each run at least one block.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "CONTRIBUTING.md"

#: the blocks that may stay unexecuted, by the reason their marker gives (keep this short: a recipe's example runs)
NOT_EXECUTED = (
    "excerpt of accelpatch/lossless/ops/rope_split_pair.py",
    "excerpt of accelpatch/models/sana_video/linear_attention.py",
    "excerpt of accelpatch/models/sana_video/adapter.py",
)
#: the recipe sections, by a part of their heading (lower case), and whether the document must have one
RECIPES = {"adding a model": True, "adding a lossless fused op": True, "adding a `high` fast path": True,
           "feature": False}

MARKER = re.compile(r"^<!--\s*not executed:\s*(.*?)\s*-->$")
FILE_HEADER = re.compile(r"^# (module|package) (accelpatch(?:\.\w+)+)\b")


@dataclass(frozen=True)
class Block:
    section: str
    line: int  # of the opening fence
    code: str
    not_executed: Optional[str]  # the marker's reason, None for a block that runs

    @property
    def label(self) -> str:
        return f"CONTRIBUTING.md line {self.line} ({self.section})"

    @property
    def new_file(self) -> Optional[Path]:
        """The file a ``# module``/``# package`` block stands for, relative to the repository (None: not one)."""
        header = FILE_HEADER.match(self.code)
        if header is None or self.not_executed is not None:
            return None
        path = Path(*header.group(2).split("."))
        return path / "__init__.py" if header.group(1) == "package" else path.with_suffix(".py")


def _parse(text: str) -> tuple[list[Block], list[str]]:
    """(the Python blocks of ``text``, the language of every fence opened)."""
    blocks, languages = [], []
    section, fence, previous = "", None, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is not None:
            if line.rstrip() == "```":
                if fence[0] == "python":
                    marker = MARKER.match(fence[2])
                    blocks.append(Block(section, fence[1], "".join(body), marker.group(1) if marker else None))
                fence = None
            else:
                body.append(line + "\n")
            continue
        opening = re.match(r"^```(\S*)\s*$", line)
        if opening:
            languages.append(opening.group(1))
            fence, body = (opening.group(1), number, previous), []
        elif line.startswith("## "):
            section = line[3:].strip()
        if line.strip():
            previous = line.strip()
    assert fence is None, f"CONTRIBUTING.md: the fence opened at line {fence[1]} is not closed"
    return blocks, languages


BLOCKS, LANGUAGES = _parse(DOCUMENT.read_text())
RUN = [block for block in BLOCKS if block.not_executed is None and block.new_file is None]
SECTIONS = list(dict.fromkeys(block.section for block in RUN))
EXCERPTS = [block for block in BLOCKS if (block.not_executed or "").startswith("excerpt of ")]


def test_every_python_block_runs_or_is_a_listed_exception():
    assert BLOCKS and RUN, "CONTRIBUTING.md has no Python block that runs"
    assert not {"py", "python3", "pycon", "ipython"} & set(LANGUAGES), (
        "fence Python as ```python (a block not meant to run says why in a <!-- not executed: ... --> line above it)")
    unlisted = [f"{block.label}: {block.not_executed!r}" for block in BLOCKS
                if block.not_executed is not None and block.not_executed not in NOT_EXECUTED]
    assert not unlisted, f"blocks marked not executed that NOT_EXECUTED does not list: {unlisted}"
    marked = [block.not_executed for block in BLOCKS if block.not_executed is not None]
    assert len(marked) == len(set(marked)) <= len(NOT_EXECUTED), marked
    for block in BLOCKS:
        path = block.new_file
        if path is not None:
            assert not (REPO / path).exists(), (
                f"{block.label}: the example's file {path} exists in the repository: show it as a marked excerpt")
            assert block.section in SECTIONS, f"{block.label}: no block of its section runs, so nothing uses {path}"


def test_every_recipe_section_runs_a_block():
    titles = {block.section for block in BLOCKS} | set(re.findall(r"^## (.*)$", DOCUMENT.read_text(), flags=re.M))
    for part, required in RECIPES.items():
        sections = [title for title in titles if part in title.lower()]
        assert sections or not required, f"CONTRIBUTING.md has no section '{part}'"
        for title in sections:
            assert title in SECTIONS, f"CONTRIBUTING.md section {title!r}: none of its Python blocks runs"


def _code_lines(code: str) -> list[str]:
    """``code``'s lines without comments or surrounding blanks, empty lines and ``...`` (lines left out) dropped."""
    lines = code.splitlines()
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                lines[row - 1] = lines[row - 1][:column]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        lines = [re.sub(r"\s+#.*$", "", line) for line in lines]
    return [line.strip() for line in lines if line.strip() and line.strip() != "..."]


@pytest.mark.parametrize("block", EXCERPTS, ids=[block.not_executed[len("excerpt of "):] for block in EXCERPTS])
def test_an_excerpt_is_lines_of_its_file_in_order(block):
    source = REPO / block.not_executed[len("excerpt of "):]
    assert source.is_file(), f"{block.label}: {source} is not a file of the repository"
    remaining = iter(_code_lines(source.read_text()))
    lines = _code_lines(block.code)
    missing = next((line for line in lines if not any(line == candidate for candidate in remaining)), None)
    assert lines and missing is None, (
        f"{block.label}: {missing!r} is not a line of {source.relative_to(REPO)} (after the excerpt's lines above "
        "it): copy the file's lines as they are now, `...` for the ones left out")


#: runs in the section's process: the example's files join the repository's packages, then every block runs
RUNNER = """
import importlib, json, sys, traceback, warnings
plan = json.load(open(sys.argv[1]))
sys.path.insert(0, plan["tests"])
for package, folder in plan["packages"]:
    importlib.import_module(package).__path__.append(folder)
warnings.simplefilter("ignore")
for label, code in plan["blocks"]:
    print(f"--- {label}", flush=True)
    try:
        exec(compile(code, label, "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(f"FAILED: {label}")
"""


def _packages(root: Path, files: list[Path]) -> list[tuple[str, str]]:
    """(the repository's package, the folder under ``root`` to add to its ``__path__``) for each example file: the
    deepest package of the repository on the file's way (a new package below it is then found through it)."""
    joins = {}
    for path in files:
        parent = path.parent
        while not (REPO / parent / "__init__.py").is_file():
            assert parent != parent.parent, f"{path} is in no package of the repository"
            parent = parent.parent
        joins[".".join(parent.parts)] = str(root / parent)
    return sorted(joins.items())


@pytest.mark.parametrize("section", SECTIONS)
def test_a_section_runs_as_written(section, tmp_path):
    files = [block for block in BLOCKS if block.section == section and block.new_file is not None]
    root = tmp_path / "example"
    for block in files:
        target = root / block.new_file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
    plan = {"tests": str(REPO / "tests"), "packages": _packages(root, [block.new_file for block in files]),
            "blocks": [(block.label, block.code) for block in RUN if block.section == section]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("ACCELPATCH_RECIPES", None)
    done = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "plan.json")], capture_output=True,
                          text=True, cwd=work, env=env, timeout=280)
    assert done.returncode == 0, f"{section}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"

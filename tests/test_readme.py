"""Every Python code block in the documentation runs as written: README.md and every page of the mkdocs site under
docs/ (test ids name the file and the block's number in it); CONTRIBUTING.md's worked examples run in
tests/test_contributing.py.

Each block runs in a fresh namespace (blocks are self-contained, as a reader copies them) in a temporary working
directory. Files a block names that stand for the user's own downloads are put there first, built from the tiny
offline models: ``SANA_Video_2.0_5B_720p.pth`` + ``config.yaml`` (a tiny SANA-Video 2.0 checkpoint in the original
layout) and ``sana-video2-pipeline/`` (a saved tiny SanaVideo2Pipeline). A block that starts with
``# torchrun --nproc-per-node 2`` is a distributed script: it runs under torchrun with two CPU processes (gloo).
"""
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
#: the documents whose Python blocks run, README first
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
TORCHRUN = "# torchrun --nproc-per-node 2"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


#: (document relative to the repository, the block's number in it, its code)
BLOCKS = [(path.relative_to(REPO).as_posix(), number, code) for path in DOCUMENTS if path.is_file()
          for number, code in enumerate(_python_blocks(path.read_text()), start=1)]
BLOCK_IDS = [f"{document}-block{number}" for document, number, _ in BLOCKS]


def _release_style_yaml(config: dict) -> dict:
    """The tiny config written the way the release's config.yaml is laid out (sections of original field names)."""
    from accelpatch.models.sana_video2.modeling.convert import _YAML_FIXED, _YAML_MAPPED

    document: dict = {}
    for section, fields in _YAML_MAPPED.items():
        for field, (kwarg, _default, _kind) in fields.items():
            if kwarg in config:
                document.setdefault(section, {})[field] = config[kwarg]
    document["model"].update({field: release for field, (release, _) in _YAML_FIXED["model"].items()})
    document["model"]["image_size"] = config["input_size"] * 32
    document.setdefault("vae", {}).update(vae_stride=[8, 32, 32], vae_downsample_rate=32)
    return document


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """A working directory holding the files the blocks name in place of the user's downloads."""
    from accelpatch.testing import tiny_sana_video2_pipeline, tiny_sana_video2_transformer

    folder = tmp_path_factory.mktemp("readme")
    model = tiny_sana_video2_transformer()
    torch.save(model.state_dict(), folder / "SANA_Video_2.0_5B_720p.pth")
    (folder / "config.yaml").write_text(yaml.safe_dump(_release_style_yaml(dict(model.config))))
    tiny_sana_video2_pipeline().save_pretrained(folder / "sana-video2-pipeline")
    return folder


def test_the_docs_have_python_blocks_and_the_readmes_first_commands_are_make_targets():
    assert len(BLOCKS) >= 11, BLOCK_IDS  # the README held 11 before its text moved into docs/
    assert _python_blocks(README), "the README has no runnable example"
    first_bash = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    assert [line.split()[0:2] for line in first_bash.strip().splitlines()[:2]] == [["make", "demo"], ["make", "test"]]


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=BLOCK_IDS)
def test_readme_python_block_runs(index, stand_ins, monkeypatch):
    document, number, code = BLOCKS[index]
    monkeypatch.chdir(stand_ins)
    if code.startswith(TORCHRUN):
        script = stand_ins / (re.sub(r"\W", "_", BLOCK_IDS[index]) + ".py")
        script.write_text(code)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                 "--standalone", str(script)], capture_output=True, text=True, env=env,
                                cwd=stand_ins, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return
    torch.set_num_threads(1)
    namespace = {"__name__": re.sub(r"\W", "_", f"doc_block_{BLOCK_IDS[index]}")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, f"{document} python block {number}", "exec"), namespace)


# --- the docs match the repository and the code ------------------------------------------------------------------


def _section(document: str, title: str) -> str:
    """The section of ``document`` (relative to the repository) whose heading starts with ``title`` ("## Name"), up
    to the next heading of its level or above outside code blocks, or the end of the file."""
    lines = (REPO / document).read_text().splitlines()
    level = len(title) - len(title.lstrip("#"))
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    fence = False
    for end in range(start + 1, len(lines)):
        fence ^= lines[end].startswith("```")
        heading = re.match(r"(#+) ", lines[end])
        if not fence and heading and len(heading.group(1)) <= level:
            break
    else:
        end = len(lines)
    return "\n".join(lines[start:end])


def test_the_blocks_that_plot_say_they_need_matplotlib():
    """`make demo` installs accelpatch without matplotlib: a documented block that plots must say so."""
    demo_install = re.search(r"^\$\(VENV\)/\.installed-demo:.*?\n\t\$\(call install,([^,]*),", (REPO / "Makefile")
                             .read_text(), flags=re.S | re.M).group(1)
    assert demo_install == ".", demo_install  # no extra: if `make demo` ever installs [plots], loosen this test
    plotting = [block for _, _, block in BLOCKS if ".plot(" in block]
    assert plotting
    for block in plotting:
        assert "needs matplotlib" in block, block


def test_plotting_without_matplotlib_says_what_to_install(monkeypatch):
    from accelpatch.eval.plots import _new_figure

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    with pytest.raises(ImportError, match=r"plotting needs matplotlib: pip install matplotlib"):
        _new_figure()


def test_the_bench_example_says_why_sol_attn_is_slower_on_the_tiny_model():
    """The validate/bench block benches tiny-minimax-h3-sol-attn, whose sol_attn candidates time ~1.8x slower on a
    CPU; the text under it must say so and why (the sequence is too short for the routing to pay)."""
    section = _section("docs/validate.md", "# Check it yourself")
    assert "tiny-minimax-h3-sol-attn" in section
    text = " ".join(section.split())
    assert "`sol_attn` candidates time about 1.8× *slower* than `exact`" in text
    assert "567 rows" in text and "Sol-Attn is for long sequences" in text


def test_the_anchor_layers_the_docs_give_for_the_release_apply_to_it():
    """The anchor_fp32_layers the docs name for the released 5B model apply to that model (release shape, on the
    meta device); a range over linear-attention layers is refused, as the docs say, naming the anchors."""
    import accelpatch
    from accelpatch import testing

    section = _section("docs/models/sana-video2.md", "# SANA-Video 2.0")
    values = re.findall(r'\(release: "([^"]+)"\)', section) + re.findall(r'`"([^"]+)"`: the release', section)
    assert values, "the SANA-Video 2.0 page names no anchor_fp32_layers for the release"
    model = testing.sana_video2_transformer_on_meta(testing.SANA_VIDEO2_5B_CONFIG)
    anchors = ",".join(map(str, model.softmax_layer_indices))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in values:
            accelpatch.apply(model, anchor_fp32_layers=value)
            accelpatch.remove(model)
        with pytest.raises(ValueError, match=f"not anchor layers.*its softmax anchors are {anchors.replace(',', ', ')}"):
            accelpatch.apply(model, anchor_fp32_layers="3-15")


#: paths the docs cite in *other* repositories, by prefix, and whose they are
EXTERNAL_PATHS = {"tests/models/": "diffusers' repository (its wheel ships no tests)",
                  "docs/sana_video2.md": "NVlabs/Sana's repository"}
CITED = re.compile(r"(?<![\w/.~-])((?:accelpatch|benchmarks|docs|notebooks|recipes|shared|tests)/[\w./*-]*[\w*/])")


def _doc_texts():
    """(file, text) of every document in the repository that cites paths: the Markdown files (the docs site's
    included), the notebooks and the Python files (docstrings and comments)."""
    for pattern in ("*.md", "docs/**/*.md", "notebooks/*.ipynb", "accelpatch/**/*.py", "benchmarks/**/*.py",
                    "tests/**/*.py"):
        for path in sorted(REPO.glob(pattern)):
            if ".venv" not in path.parts:
                yield path, path.read_text()


def test_every_repo_path_the_docs_cite_exists():
    missing = []
    for path, text in _doc_texts():
        for match in CITED.finditer(text):
            cited = match.group(1).rstrip(".")
            if text[match.end():match.end() + 1] == "<":
                continue  # a path pattern with a placeholder (CONTRIBUTING's tests/test_<family>.py), no one file
            if any(cited.startswith(prefix) for prefix in EXTERNAL_PATHS):
                continue
            if not ((REPO / cited).exists() or any(REPO.glob(cited)) or (path.parent / cited).exists()):
                line = text.count("\n", 0, match.start()) + 1
                missing.append(f"{path.relative_to(REPO)}:{line}: {cited}")
    assert not missing, "the docs cite files that are not in the repository:\n" + "\n".join(missing)

"""The shipped recipes: one copy, the repository's top-level ``recipes/``, which setup.cfg maps into the wheel as
the package ``accelpatch.recipe_files`` (an installed wheel, and an editable install of a checkout, find them all by
name); and applicable, with every candidate, to the model each one is for, built at its release size on the meta
device."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from accelpatch import testing
from accelpatch.recipes import SHIPPED_RECIPES, load_recipe
from accelpatch.testing.wan import WAN_1_3B_CONFIG
from accelpatch.eval.preflight import check_candidates

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(SHIPPED_RECIPES.glob("*.yaml"))


def test_the_shipped_recipes_are_the_top_level_recipes_folder():
    """#41: the layout's recipes/ holds them, one copy; the package holds none (the wheel gets them from setup.cfg)."""
    assert SHIPPED_RECIPES == REPO / "recipes"
    assert {p.stem for p in SHIPPED} >= {"tiny-sana-video", "sana-video2-720p-middle", "minimax-h3-sol-attn"}
    assert not (REPO / "accelpatch" / "recipe_files").exists(), "the shipped recipes live in recipes/ only"


def _run(*command: str, **kwargs) -> str:
    """Run a command; on failure, fail the test with its output (not a bare CalledProcessError)."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result.stdout


def _source_copy(tmp_path: Path) -> Path:
    """A copy of what a wheel is made of: the package, the shipped recipes, the setup files (the checkout stays
    clean)."""
    source = tmp_path / "src"
    for folder in ("accelpatch", "recipes"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "setup.py", "MANIFEST.in", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, source / name)
    return source


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout, built from a copy of it."""
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", str(dist), str(_source_copy(tmp_path)))
    (wheel,) = dist.glob("accelpatch-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a new virtual environment with nothing installed yet; torch, diffusers and the rest
    come from this interpreter's site-packages, added as a plain path, so that no ``.pth`` there runs (the editable
    install of the checkout stays invisible)."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    purelib = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (purelib / "zz_dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return python, purelib


def _install_wheel(tmp_path: Path, wheel: Path) -> Path:
    """The fresh environment's python, with only the wheel installed into it (no dependencies)."""
    python, purelib = _fresh_venv(tmp_path)
    # --target, not --prefix: with --prefix pip also uninstalls the package from the environment it runs in (here the
    # test venv's editable accelpatch, which every later subprocess of the suite needs)
    _run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", str(purelib),
         str(wheel))
    return python


#: in the fresh environment: every recipe is listed (``accelpatch recipes``' lookup) and loads by name, through the
#: lookup apply(pipe, recipe=NAME) uses (applying one would add a diffusers import, ~30 s here, and test nothing more
#: about packaging)
PROBE = """
import json, accelpatch
from accelpatch.recipes import SHIPPED_RECIPES, available_recipes, load_recipe
known = available_recipes()
for name, path in known.items():
    assert load_recipe(name).name == name
from importlib import resources
from accelpatch.lossless.kernels import cpu_build  # what the CPU kernels' build reads from the installed package
for name in cpu_build.SOURCES + cpu_build.HEADERS:
    assert resources.files("accelpatch.lossless.kernels").joinpath(name).is_file(), name
from accelpatch.tiny_models.shipped import WEIGHTS_DIR, shipped_families
print(json.dumps({"package": accelpatch.__file__, "shipped": str(SHIPPED_RECIPES), "tiny": list(shipped_families()),
                  "tiny_dir": str(WEIGHTS_DIR),
                  "recipes": {n: str(p) for n, p in known.items()}}))
"""


def _probe(python: Path, tmp_path: Path) -> dict:
    """What the probe finds, run by ``python`` in an empty folder without the checkout on its path."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ACCELPATCH_RECIPES")}
    # -I: neither the checkout (cwd, PYTHONPATH) nor user site-packages can stand in for the installed package
    output = _run(str(python), "-I", "-c", PROBE, cwd=work, env=env)
    return json.loads(output.strip().splitlines()[-1])


def test_the_wheel_carries_every_recipe_and_an_installed_accelpatch_loads_them(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    # recipes/, mapped to the package accelpatch.recipe_files (setup.cfg): its recipes, once, and nothing else
    inside = "accelpatch.recipe_files".replace(".", "/")
    assert {name for name in names if "recipe_files" in name} == {f"{inside}/{p.name}" for p in SHIPPED}
    assert not any(name.startswith("recipes/") for name in names), "the recipes must install inside the package"
    kernels = {"cpu_kernels.cpp", "cpu_kernels.h", "cpu_ops.cpp"}  # the CPU kernels are built from these
    assert {f"accelpatch/lossless/kernels/{name}" for name in kernels} <= names
    weights = REPO / "accelpatch" / "tiny_models" / "weights"  # the trained tiny pipelines, every file of them
    shipped_files = {p.relative_to(REPO).as_posix() for p in weights.rglob("*") if p.is_file()}
    assert shipped_files and shipped_files <= names, sorted(shipped_files - names)
    python = _install_wheel(tmp_path, wheel)
    found = _probe(python, tmp_path)
    installed = tmp_path / "venv"
    assert Path(found["package"]).is_relative_to(installed), found["package"]
    assert Path(found["shipped"]).is_relative_to(installed) and Path(found["shipped"]).name == "recipe_files"
    assert set(found["recipes"]) == {p.stem for p in SHIPPED}  # `accelpatch recipes` lists every one
    assert "wan" in found["tiny"] and Path(found["tiny_dir"]).is_relative_to(installed)
    assert all(Path(p).is_relative_to(installed) for p in found["recipes"].values())


def test_an_editable_install_reads_the_recipes_folder_of_its_checkout(tmp_path):
    """``pip install -e .`` (what ``make test`` and ``make demo`` do): setuptools' editable finder cannot import the
    mapped ``accelpatch.recipe_files`` (no ``__init__.py``), so the loader reads the checkout's ``recipes/``."""
    source = _source_copy(tmp_path)
    python, _ = _fresh_venv(tmp_path)
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--editable", str(source))
    found = _probe(python, tmp_path)
    assert Path(found["package"]).is_relative_to(source / "accelpatch"), found["package"]
    assert found["shipped"] == str(source / "recipes")
    assert found["recipes"] == {p.stem: str(source / "recipes" / p.name) for p in SHIPPED}


# --- every shipped recipe applies, with every candidate, at its release size ------------------------------------

def _minimax_h3_release():
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        return MiniMaxH3Transformer3DModel()  # diffusers' defaults are the released model's shape


class _TwoExperts:
    """What apply() reads of a Wan 2.2 pipeline: ``transformer`` (high noise) and ``transformer_2`` (low noise)."""

    def __init__(self, transformer, transformer_2):
        self.transformer, self.transformer_2 = transformer, transformer_2


def _wan22_a14b_release():
    """Wan2.2-T2V-A14B's two experts, each the Wan2.1-14B shape (diffusers' defaults), as a pipeline carries them:
    apply() must patch both."""
    return _TwoExperts(testing.wan_transformer_on_meta(), testing.wan_transformer_on_meta())


def _ltx2_release():
    from diffusers import LTX2VideoTransformer3DModel

    with torch.device("meta"):
        return LTX2VideoTransformer3DModel()  # diffusers' defaults: LTX-2 19B (48 layers, 32 x 128; 18.9B parameters)


def _hunyuan_video15_step_distilled_release():
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):  # diffusers' defaults: the 8.3B model (54 layers, 16 x 128); the step-distilled
        return HunyuanVideo15Transformer3DModel(use_meanflow=True)  # checkpoint adds the meanflow time embedding


#: each shipped recipe's model -> the transformer it patches, at the size it is for (release sizes on the meta
#: device; the tiny models are real). A new recipe for a new model must add its model here.
RELEASE_MODELS = {
    "Efficient-Large-Model/SANA-Video_2B_480p_diffusers": testing.sana_video_transformer_on_meta,
    "./sana-video2-5b-720p": lambda: testing.sana_video2_transformer_on_meta(testing.SANA_VIDEO2_5B_CONFIG),
    "MiniMaxAI/MiniMax-H3": _minimax_h3_release,
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": testing.wan_transformer_on_meta,  # diffusers' defaults: 14B
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": lambda: testing.wan_transformer_on_meta(WAN_1_3B_CONFIG),
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": _wan22_a14b_release,
    "rootonchair/LTX-2-19b-distilled": _ltx2_release,
    "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v_step_distilled": _hunyuan_video15_step_distilled_release,
    "./sana-video2-5b-720p-4step": lambda: testing.sana_video2_transformer_on_meta(testing.SANA_VIDEO2_5B_CONFIG),
}


def _model_for(recipe):
    if recipe.is_tiny:
        from accelpatch.eval.pipelines import load_pipeline

        return load_pipeline(recipe.model_copy(update={"device": "cpu"})).pipe
    assert recipe.model in RELEASE_MODELS, f"recipe {recipe.name}: add its model {recipe.model!r} to RELEASE_MODELS"
    return RELEASE_MODELS[recipe.model]()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_recipe_and_candidate_applies_to_its_model_at_release_size(path):
    import accelpatch

    recipe = load_recipe(path)
    target = _model_for(recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is unavailable" on this machine: mounting is not what is tested
        accelpatch.apply(target, **recipe.apply_arguments())
        accelpatch.remove(target)
        check_candidates(target, recipe.candidate_specs())  # raises naming the candidate that does not apply
    from accelpatch.core.patcher import patch_of, transformers_of

    assert all(patch_of(model) is None for model in transformers_of(target))  # left unpatched, as it came


@pytest.mark.parametrize("path", [p for p in SHIPPED if load_recipe(p).scheduler], ids=lambda p: p.stem)
def test_a_shipped_recipes_scheduler_names_a_class_and_keys_it_has(path):
    """#42: each ``scheduler:`` class resolves (diffusers' or accelpatch's) and its overrides are keys of its config
    (a class-less one is checked against the pipeline's own scheduler when the pipeline loads)."""
    from accelpatch.recipes import scheduler_class, scheduler_overrides

    spec = load_recipe(path).scheduler
    if spec.get("class"):
        scheduler_overrides(spec, scheduler_class(spec["class"]))


def test_wan22s_recipe_patches_both_experts_at_release_size():
    import accelpatch
    from accelpatch.core.patcher import patch_of

    recipe = load_recipe("wan2.2-t2v-a14b-lightning-4step")
    target = _model_for(recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(target, **recipe.apply_arguments())
    try:
        assert patch_of(target.transformer) is not None and patch_of(target.transformer_2) is not None
        assert {lora.component for lora in recipe.lora} == {"transformer", "transformer_2"}
    finally:
        accelpatch.remove(target)


def test_every_shipped_recipe_is_in_the_recipes_page():
    """#40: docs/recipes.md lacked the three tiny sol_attn recipes of Wan, HunyuanVideo 1.5 and LTX-2."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "recipes.md").read_text()
    missing = [p.stem for p in SHIPPED if f"`{p.stem}`" not in page]
    assert not missing, missing

"""The shipped recipes: inside the built wheel (an installed accelpatch finds them all by name)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from accelpatch.recipes import SHIPPED_RECIPES

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(SHIPPED_RECIPES.glob("*.yaml"))


def test_the_shipped_recipes_are_package_data():
    assert {p.stem for p in SHIPPED} >= {"tiny-sana-video", "sana-video2-720p-middle", "minimax-h3-sol-attn"}
    assert not list((REPO / "recipes").glob("*.yaml")), "shipped recipes belong in accelpatch/recipe_files/"


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout, built from a copy of what a wheel is made of (the checkout stays clean)."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "accelpatch", source / "accelpatch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "setup.py", "MANIFEST.in", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--wheel-dir", str(dist), str(source)], check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("accelpatch-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment with only the wheel installed into it (no dependencies); torch, diffusers and the
    rest come from this interpreter's site-packages, added as a plain path, so that no ``.pth`` there runs (the
    editable install of the checkout stays invisible)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--prefix",
                    str(venv), str(wheel)], check=True, capture_output=True, text=True)
    return python


PROBE = """
import json, accelpatch
from accelpatch.recipes import available_recipes, load_recipe
known = available_recipes()
for name, path in known.items():
    assert load_recipe(name).name == name
print(json.dumps({"package": accelpatch.__file__, "recipes": {n: str(p) for n, p in known.items()}}))
"""


def test_the_wheel_carries_every_recipe_and_an_installed_accelpatch_loads_them(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"accelpatch/recipe_files/{p.name}" for p in SHIPPED} <= names
    python = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ACCELPATCH_RECIPES")}
    # -I: neither the checkout (cwd, PYTHONPATH) nor user site-packages can stand in for the installed package
    result = subprocess.run([str(python), "-I", "-c", PROBE], cwd=work, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    import json

    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).is_relative_to(tmp_path / "venv"), found["package"]
    assert set(found["recipes"]) == {p.stem for p in SHIPPED}
    assert all(Path(p).is_relative_to(tmp_path / "venv") for p in found["recipes"].values())

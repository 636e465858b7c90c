"""Issue #33: the package is organised by feature (core, lossless, sol_attn, step_cache, models, eval). Each old
import path still gives the moved module itself (one module object: state and monkeypatching shared) with a
DeprecationWarning naming the new path, for one release, from one table (``accelpatch._moved.MOVED``); accelpatch's
own code imports only the new paths, so a user who does not use an old path never sees the warning."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import accelpatch
from accelpatch import _moved

PACKAGE = Path(accelpatch.__file__).parent

#: old paths a user may have imported, each with the module it must now be (written out here, not read from the table)
OLD_PATHS = {
    "accelpatch.patcher": "accelpatch.core.patcher",
    "accelpatch.gate": "accelpatch.core.gate",
    "accelpatch.tiers": "accelpatch.core.tiers",
    "accelpatch.steps": "accelpatch.core.steps",
    "accelpatch.reporting": "accelpatch.core.reporting",
    "accelpatch.errors": "accelpatch.core.errors",
    "accelpatch.sites.base": "accelpatch.core.sites",
    "accelpatch.adapters.base": "accelpatch.core.adapter",
    "accelpatch.verify": "accelpatch.lossless.verify",
    "accelpatch.fused_ops": "accelpatch.lossless.ops",
    "accelpatch.ops.fused.cpu": "accelpatch.lossless.kernels.cpu",
    "accelpatch.ops.fused.reference": "accelpatch.lossless.kernels.reference",
    "accelpatch.sites.fused_swiglu": "accelpatch.lossless.swiglu",
    "accelpatch.ops.gemm": "accelpatch.models.sana_video.gemm",
    "accelpatch.adapters": "accelpatch.models",
    "accelpatch.adapters.ltx2.fused": "accelpatch.models.ltx2.lossless",
    "accelpatch.adapters.sana_video.block": "accelpatch.models.sana_video.block",
    "accelpatch.modeling.sana_video2": "accelpatch.models.sana_video2.modeling",
    "accelpatch.modeling.sana_video2.transformer": "accelpatch.models.sana_video2.modeling.transformer",
    "accelpatch.modeling.sana_video2_release": "accelpatch.models.sana_video2.release",
    "accelpatch.backends.sol_attn": "accelpatch.sol_attn.config",
    "accelpatch.backends.attention_backend": "accelpatch.sol_attn.diffusers_backend",
    "accelpatch.backends.attention_registry": "accelpatch.sol_attn.registration",
    "accelpatch.sites.sol_attention": "accelpatch.sol_attn.sites",
    "accelpatch.adapters.sol_attn_adapter": "accelpatch.sol_attn.adapter",
    **{f"accelpatch.tools.{name}": f"accelpatch.eval.{name}" for name in (
        "validate", "bench", "tune", "tune_space", "tune_search", "tune_plot", "metrics", "audio_metrics", "plots",
        "stats", "candidates", "preflight", "pipelines", "_report_text", "recipe_cli")},
}


def test_an_old_path_is_the_moved_module_and_warns():
    code = f"""
import importlib, sys, warnings
moved = {OLD_PATHS!r}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from accelpatch.ops import sol_attn
    from accelpatch.backends import BACKENDS, resolve_backend  # an old package whose home is now a module
    from accelpatch.modeling import SanaVideo2Pipeline
    from accelpatch.adapters.wan import WanAdapter  # an adapter package's names are now its adapter module's
assert sol_attn is importlib.import_module("accelpatch.sol_attn.op").sol_attn
assert resolve_backend is importlib.import_module("accelpatch.core.backends").resolve_backend
assert SanaVideo2Pipeline is importlib.import_module("accelpatch.models.sana_video2.modeling").SanaVideo2Pipeline
assert WanAdapter is importlib.import_module("accelpatch.models.wan.adapter").WanAdapter
assert any("accelpatch.sol_attn.op" in str(w.message) for w in caught)
for old, new in moved.items():
    fresh = old not in sys.modules  # a parent package imported with an earlier path warned then
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    assert module is target, old
    assert target.__spec__.name == new, (old, target.__spec__.name)  # the new module keeps its own spec
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not fresh or any(new in s for s in said), (old, said)
try:
    importlib.import_module("accelpatch.no_such_module")
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("a name that never existed must not import")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_every_old_path_of_the_table_names_a_module_that_exists():
    missing = [f"{old} -> {new}" for old, new in _moved.MOVED.items()
               if importlib.util.find_spec(new) is None]
    assert not missing, missing
    assert set(OLD_PATHS) - set(_moved.MOVED) <= {o for o in OLD_PATHS if _moved.new_path(o) == OLD_PATHS[o]}


def test_no_old_path_has_a_file_and_accelpatch_imports_no_old_path():
    """An old path is only a table entry (a file at an old path would shadow the table), and accelpatch itself
    imports only new paths."""
    shadowing = [old for old in _moved.MOVED if importlib.machinery.PathFinder.find_spec(
        old.rpartition(".")[2], [str(PACKAGE.parent.joinpath(*old.split(".")[:-1]))]) is not None]
    assert not shadowing, shadowing
    bad = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("accelpatch.") and _moved.new_path(name) is not None:
                    bad.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert not bad, bad


def test_the_public_surface_is_small_and_a_former_top_level_name_warns_naming_its_home():
    """accelpatch.__all__ is the core (patch, tier, report, check and time it); a name that moved to its subpackage
    is still found at the top for one release, as the same object, with a DeprecationWarning naming the new home."""
    import importlib
    import warnings

    assert set(accelpatch.__all__) == {
        "apply", "patched", "remove", "report", "quality", "current_quality", "denoising_step", "supported_models",
        "SolAttnConfig", "Recipe", "load_recipe", "validate", "bench", "tune", "doctor", "AccelpatchError",
        "FastPathUnavailableError", "__version__"}
    for name, home in accelpatch._MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(accelpatch, name)
        assert value is getattr(importlib.import_module(home), name), name
        assert any(issubclass(w.category, DeprecationWarning) and f"{home}.{name}" in str(w.message)
                   for w in caught), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the core and the subpackages are reached without a warning
        for name in accelpatch.__all__:
            getattr(accelpatch, name)
        for package in ("core", "lossless", "sol_attn", "step_cache", "parallel", "models", "eval"):
            assert getattr(accelpatch, package).__name__ == f"accelpatch.{package}"

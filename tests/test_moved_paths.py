"""Issue #33: Sol-Attn moved into ``accelpatch/sol_attn/``, the evaluation tools into ``accelpatch/eval/``. Each old import path still gives the moved module itself
(one module object: state and monkeypatching shared) with a DeprecationWarning naming the new path, for one release;
accelpatch's own code imports only the new paths, so a user who does not use an old path never sees the warning."""
import ast
import subprocess
import sys
from pathlib import Path

import accelpatch

PACKAGE = Path(accelpatch.__file__).parent
MOVED = {
    "accelpatch.backends.sol_attn": "accelpatch.sol_attn.config",
    "accelpatch.backends.attention_backend": "accelpatch.sol_attn.diffusers_backend",
    "accelpatch.backends.attention_registry": "accelpatch.sol_attn.registration",
    "accelpatch.sites.sol_attention": "accelpatch.sol_attn.sites",
    "accelpatch.adapters.sol_attn_adapter": "accelpatch.sol_attn.adapter",
    # the evaluation tools: accelpatch.eval
    **{f"accelpatch.tools.{name}": f"accelpatch.eval.{name}" for name in (
        "validate", "bench", "tune", "tune_space", "tune_search", "tune_plot", "metrics", "audio_metrics", "plots",
        "stats", "candidates", "preflight", "pipelines", "_report_text", "recipe_cli")},
}


def test_an_old_path_is_the_moved_module_and_warns():
    code = f"""
import importlib, warnings
moved = {MOVED!r}
for old, new in moved.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new), old
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(old in s and new in s for s in said), (old, said)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from accelpatch.ops import sol_attn
assert sol_attn is importlib.import_module("accelpatch.sol_attn.op").sol_attn
assert any("accelpatch.sol_attn.op" in str(w.message) for w in caught)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_accelpatch_itself_imports_no_old_path():
    stubs = {PACKAGE.parent / (old.replace(".", "/") + ".py") for old in MOVED}
    bad = []
    for path in PACKAGE.rglob("*.py"):
        if path in stubs:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if any(("." + name).endswith(old.removeprefix("accelpatch")) for old in MOVED):  # relative too
                    bad.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert not bad, bad
    assert all(stub.exists() for stub in stubs)


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
        for package in ("sol_attn", "parallel", "eval", "modeling", "steps", "tiers"):
            assert getattr(accelpatch, package).__name__ == f"accelpatch.{package}"

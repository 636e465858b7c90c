"""The ground floor imports nothing above it: tiers, steps, call_context, errors, ops/ and modeling/ are read by the
patching machinery, never the reverse (once, tiers imported the patcher and the gate imported every adapter, which
tied 15 modules into one import circle). Every import counts, also one inside a function."""
import ast
from pathlib import Path

import pytest

import accelpatch

PACKAGE = Path(accelpatch.__file__).parent

#: what each ground-floor module or folder may import from accelpatch (besides itself)
ALLOWED = {
    "accelpatch.errors": set(),
    # old paths of moved modules and lazily imported public names (imports only what it is asked for, by name)
    "accelpatch._moved": set(),
    "accelpatch.call_context": set(),
    # version-dependent torch internals, feature-detected once (imports only torch)
    "accelpatch.torch_compat": set(),
    "accelpatch.tiers": {"accelpatch.call_context"},
    "accelpatch.steps": {"accelpatch.call_context"},
    # ``accelpatch.ops.sol_attn`` (the function) is still found there for one release, lazily, from its new home
    "accelpatch.ops": {"accelpatch.errors", "accelpatch.sol_attn.op"},
    # the Sol-Attn op (moved beside the rest of Sol-Attn) builds its AOT checks on the ops' Triton helpers
    "accelpatch.sol_attn.op": {"accelpatch.errors", "accelpatch.ops"},
    # our own models' token-mixing layers combine sequence shards with the generic collectives (which import nothing)
    "accelpatch.modeling": {"accelpatch.errors", "accelpatch.ops", "accelpatch.sol_attn.op", "accelpatch.parallel.sequence",
                            "accelpatch._moved"},
    # the gate keeps the fusion registry: fusions register where they are defined, and a pickle names that module
    "accelpatch.gate": {"accelpatch.tiers", "accelpatch.call_context", "accelpatch.torch_compat"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    name = _module_name(path)
    return _imports_of(path.read_text(), name if path.name == "__init__.py" else name.rpartition(".")[0])


def _imports_of(source: str, package: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if node.module:
                found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import x` imports module x
    return {m for m in found if m == "accelpatch" or m.startswith("accelpatch.")}


def _floor_of(module: str) -> str:
    return next((floor for floor in ALLOWED if module == floor or module.startswith(floor + ".")), "")


def _is_allowed(imported: str, floor: str) -> bool:
    if _floor_of(imported) == floor:
        return True
    return any(imported == ok or imported.startswith(ok + ".") for ok in ALLOWED[floor])


@pytest.mark.parametrize("floor", sorted(ALLOWED))
def test_ground_floor_imports_nothing_above_it(floor):
    files = [p for p in PACKAGE.rglob("*.py") if _floor_of(_module_name(p)) == floor]
    assert files, floor
    bad = {}
    for path in files:
        upward = sorted(m for m in _imports(path) if not _is_allowed(m, floor)
                        and not _is_allowed(m.rpartition(".")[0], floor))  # `from .x import name`: name is no module
        if upward:
            bad[_module_name(path)] = upward
    assert not bad, bad


def test_the_check_sees_every_kind_of_import():
    source = "from . import call_context\ndef f():\n    from .patcher import patch_of\n    import accelpatch.gate\n"
    found = _imports_of(source, "accelpatch")
    assert {"accelpatch.call_context", "accelpatch.patcher", "accelpatch.gate"} <= found
    assert not _is_allowed("accelpatch.patcher", "accelpatch.tiers")
    assert _is_allowed("accelpatch.call_context", "accelpatch.tiers")

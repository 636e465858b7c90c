"""The ground floor imports nothing above it: tiers, steps, call_context, errors, the kernels and our model code are read by the
patching machinery, never the reverse (once, tiers imported the patcher and the gate imported every adapter, which
tied 15 modules into one import circle). Every import counts, also one inside a function."""
import ast
from pathlib import Path

import pytest

import accelpatch

PACKAGE = Path(accelpatch.__file__).parent

#: what each ground-floor module or folder may import from accelpatch (besides itself)
ALLOWED = {
    "accelpatch.core.errors": set(),
    # lazily imported public names (imports only what it is asked for, by name)
    "accelpatch._lazy": set(),
    "accelpatch.core.call_context": set(),
    # version-dependent torch internals, feature-detected once (imports only torch)
    "accelpatch.core.torch_compat": set(),
    "accelpatch.core.tiers": {"accelpatch.core.call_context"},
    "accelpatch.core.steps": {"accelpatch.core.call_context"},
    # the shared ahead-of-time Triton capture (imports only torch and triton)
    "accelpatch.core.triton_aot": set(),
    # pipeline classes of our own offered in diffusers' namespace, for DiffusionPipeline.from_pretrained (imports only
    # diffusers, and the offered class's module when diffusers asks for it)
    "accelpatch.core.diffusers_namespace": set(),
    # the lossless kernels and the Sol-Attn op build their AOT checks on the shared Triton capture
    "accelpatch.lossless.kernels": {"accelpatch.core.errors", "accelpatch.core.triton_aot"},
    "accelpatch.sol_attn.op": {"accelpatch.core.errors", "accelpatch.core.triton_aot"},
    # SANA-Video's BF16 GEMM (a kernel, no model knowledge)
    "accelpatch.models.sana_video.gemm": set(),
    # our own models' token-mixing layers combine sequence shards with the generic collectives (which import nothing)
    "accelpatch.models.sana_video2.modeling": {"accelpatch.core.errors", "accelpatch.core.diffusers_namespace",
                                               "accelpatch.models.sana_video.gemm",
                                               "accelpatch.models.sana_video2.release",
                                               "accelpatch.sol_attn.op", "accelpatch.parallel.sequence"},
    # the gate keeps the fusion registry: fusions register where they are defined, and a pickle names that module
    "accelpatch.core.gate": {"accelpatch.core.tiers", "accelpatch.core.call_context", "accelpatch.core.torch_compat"},
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
            submodules = [f"{module}.{alias.name}" for alias in node.names]  # `from . import x` imports module x
            if node.module and not all(map(_is_module, submodules)):  # a package's own names: its __init__ counts
                found.add(module)
            found.update(submodules)
    return {m for m in found if m == "accelpatch" or m.startswith("accelpatch.")}


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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
    source = "from . import call_context\ndef f():\n    from .patcher import patch_of\n    import accelpatch.core.gate\n"
    found = _imports_of(source, "accelpatch.core")
    assert {"accelpatch.core.call_context", "accelpatch.core.patcher", "accelpatch.core.gate"} <= found
    assert not _is_allowed("accelpatch.core.patcher", "accelpatch.core.tiers")
    assert _is_allowed("accelpatch.core.call_context", "accelpatch.core.tiers")


def _graph() -> dict[str, set[str]]:
    """Module -> the accelpatch modules it imports (a package import counts as its ``__init__``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def test_no_two_modules_import_each_other_even_through_others():
    """#41: three import circles (eval/plots <-> eval/validate, eval/tune <-> eval/tune_plot, SANA-Video 2.0's
    convert <-> transformer): a plot takes the results it draws, and the checkpoint reader takes the model class."""
    graph = _graph()
    index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, circles


#: #41: the house's floors, lowest first. A module imports only from its own floor or below: the core hosts the
#: features and the families (they register themselves: accelpatch.core.features), so no arrow runs back up.
FLOORS = (
    ("core", ("accelpatch.core", "accelpatch._lazy")),
    ("features", ("accelpatch.lossless", "accelpatch.sol_attn", "accelpatch.step_cache", "accelpatch.parallel",
                  "accelpatch.low_memory")),
    ("models", ("accelpatch.models",)),
    ("tools", ("accelpatch.eval", "accelpatch.tools", "accelpatch.testing", "accelpatch.recipes",
               "accelpatch.__main__", "accelpatch")),
)


def _level(module: str) -> int:
    best = None
    for level, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    assert best is not None, f"{module} is on no floor of FLOORS: add it"
    return best[0]


def _upward_arrows() -> list[str]:
    arrows = []
    for name, imported in _graph().items():
        for target in sorted(imported):
            if _level(target) > _level(name):
                arrows.append(f"{name} ({FLOORS[_level(name)][0]}) -> {target} ({FLOORS[_level(target)][0]})")
    return arrows


def test_no_arrow_runs_back_up_core_features_models_tools():
    """core <- {lossless, sol_attn, step_cache, parallel} <- models <- {eval, tools, testing}: the core imports no
    feature and no model, a feature no model, a model no tool (every import counts, also one inside a function)."""
    assert not _upward_arrows()


def test_the_floor_check_sees_an_upward_arrow():
    assert _level("accelpatch.core.patcher") < _level("accelpatch.step_cache.cache") < _level("accelpatch.models.wan")
    assert _level("accelpatch.models.wan.adapter") < _level("accelpatch.eval.tune") == _level("accelpatch")

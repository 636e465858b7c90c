"""Issue #33: one file per lossless fused op, its kernels registered on the op by decorator (no name lookups).

Every registered op has its reference chain and a CPU and/or CUDA kernel registered by ``FusedOp.kernel`` from its
own module under ``accelpatch/lossless/ops/``; nothing under ``accelpatch/lossless`` finds a kernel by name (no
``importlib``, no ``getattr`` on a module); ``substituted`` puts a stand-in kernel in place for a block only."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import accelpatch.lossless
import accelpatch.lossless.ops  # noqa: F401 - registers the package's ops
from accelpatch.lossless.kernels import cpu, triton_kernels
from accelpatch.lossless.kernels.library import Kernel, KernelLibrary
from accelpatch.lossless.verify import FusedOp, ops

LOSSLESS = Path(accelpatch.lossless.__file__).parent
LIBRARIES = {"cpu": cpu.LIBRARY, "cuda": triton_kernels.LIBRARY}


@pytest.mark.parametrize("name", sorted(ops()))
def test_every_op_has_its_reference_and_kernels_in_its_own_module(name):
    op = ops()[name]
    assert callable(op.reference), name
    assert op.kernels, f"{name}: no kernel registered"
    assert set(op.kernels) <= set(LIBRARIES), (name, sorted(op.kernels))
    home = inspect.getmodule(op.reference).__name__
    assert home.startswith("accelpatch.lossless.ops."), (name, home)
    assert vars(inspect.getmodule(op.reference)).get(
        next(k for k, v in vars(accelpatch.lossless.ops).items() if v is op)) is op, f"{name} is not declared in {home}"
    for device_type, kernel in op.kernels.items():
        assert isinstance(kernel, Kernel) and kernel.name == name
        assert kernel.library is LIBRARIES[device_type], (name, device_type)
        assert list(inspect.signature(kernel.run).parameters) == list(inspect.signature(op.reference).parameters)
    devices = op.devices or tuple(LIBRARIES)
    assert set(devices) <= set(op.kernels), f"{name} is fused on {devices} but has kernels for {sorted(op.kernels)}"


def test_every_op_constant_of_the_package_is_registered():
    constants = {k: v for k, v in vars(accelpatch.lossless.ops).items() if isinstance(v, FusedOp)}
    assert sorted(op.name for op in constants.values()) == sorted(ops())


def _name_lookups(path: Path) -> list[str]:
    """Module lookups by name in ``path``: ``importlib.import_module``/``__import__`` (``importlib.util.find_spec``,
    which only asks whether Triton is installed, is no lookup) and ``getattr`` on a module."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.Import) for alias in node.names}
    modules |= {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("accelpatch")
                for alias in node.names
                if (LOSSLESS.parent.parent / node.module.replace(".", "/") / f"{alias.name}.py").is_file()}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib" and any(
                a.name == "import_module" for a in node.names):
            found.append(f"line {node.lineno}: from importlib import import_module")
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            found.append(f"line {node.lineno}: importlib.import_module")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(f"line {node.lineno}: __import__(...)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in modules):
            found.append(f"line {node.lineno}: getattr({node.args[0].id}, ...)")
    return found


def test_nothing_under_lossless_looks_kernels_up_by_name():
    bad = {str(p.relative_to(LOSSLESS)): found for p in sorted(LOSSLESS.rglob("*.py")) if (found := _name_lookups(p))}
    assert not bad, bad


def test_the_name_lookup_check_sees_a_lookup(tmp_path):
    source = tmp_path / "lookup.py"
    source.write_text("import importlib\nfrom accelpatch.lossless.kernels import cpu\n"
                      "def find(name):\n    return getattr(importlib.import_module(name), 'x'), getattr(cpu, name)\n")
    assert sorted(_name_lookups(source)) == ["line 4: getattr(cpu, ...)", "line 4: importlib.import_module"]


def test_a_substituted_kernel_runs_inside_the_block_only():
    op = ops()["modulate"]
    real = op.kernels["cpu"]
    library = KernelLibrary("cpu", "CPU", lambda name, check, args: check(*args))
    stand_in = Kernel("modulate", library, lambda *args: "stand-in", lambda *args: None)
    with op.substituted(stand_in):
        assert op.kernels["cpu"] is stand_in
        assert op.implementation(torch.device("cpu")) == (stand_in, None)
    assert op.kernels["cpu"] is real


def test_a_second_kernel_for_one_device_is_refused():
    op = FusedOp("twice", lambda x: x, "a test op")
    op.kernel(cpu.LIBRARY, unsupported=lambda x: None)(lambda x: x)
    with pytest.raises(ValueError, match="twice already has a cpu kernel"):
        op.kernel(cpu.LIBRARY, unsupported=lambda x: None)(lambda x: x)
    assert op.implementation(torch.device("cuda"))[1] == "no Triton kernel for 'twice' in this version of accelpatch"

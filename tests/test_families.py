"""#41: each model family registers once, in its own package (accelpatch.models.families), and every list that
named families reads the registry: the adapters, ``tiny:<name>`` recipes, the demo's ``--model``, diffusers' own
model tests. Adding a family is its package (which registers it) plus its tests."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import accelpatch
from accelpatch import testing
from accelpatch.models.families import families

PACKAGE = Path(accelpatch.__file__).parent
KEYS = ("sana_video", "sana_video2", "minimax_h3", "wan", "wan_vace", "wan_animate", "hunyuan_video15", "ltx2")


def test_the_families_register_themselves_in_order_with_their_tiny_builders():
    found = families()
    assert tuple(f.key for f in found) == KEYS
    assert tuple(f.cli for f in found) == ("sana-video", "sana-video2", "minimax-h3", "wan", "wan-vace", "wan-animate",
                                           "hunyuan-video15", "ltx2")
    for family in found:
        assert family.adapter.startswith(f"accelpatch.models.{family.key}.adapter:")
        assert family.adapter_class().__module__ == f"accelpatch.models.{family.key}.adapter"
        for name in (f"tiny_{family.key}_transformer", f"{family.key}_transformer_inputs", f"tiny_{family.key}_pipeline",
                     f"{family.key}_pipeline_call_kwargs"):
            assert callable(getattr(testing, name)), name


def test_every_list_that_named_families_reads_the_registry():
    from accelpatch.models.registry import ADAPTERS
    from accelpatch.recipes import TINY_MODELS
    from accelpatch.testing import diffusers_tests, diffusers_tests_plugin
    from accelpatch.tools import demo_sections

    keys = [f.key for f in families()]
    assert [type(a) for a in ADAPTERS] == [f.adapter_class() for f in families()]
    assert TINY_MODELS == tuple(f.cli for f in families()) == tuple(demo_sections.MODELS)
    assert tuple(diffusers_tests.TEST_FILES) == diffusers_tests_plugin.MODEL_FAMILIES == (
        "wan", "wan_vace", "wan_animate", "hunyuan_video15", "ltx2")
    assert set(diffusers_tests.TEST_FILES) <= set(keys)


def _hand_lists(source: str) -> list[int]:
    """Lines of tuple/list/set/dict literals that name three or more families (by key or command-line name)."""
    names = set(KEYS) | {f.cli for f in families()}
    found = []
    for node in ast.walk(ast.parse(source)):
        items = (node.keys if isinstance(node, ast.Dict) else node.elts
                 if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [])
        named = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
        if len(named) >= 3:
            found.append(node.lineno)
    return found


def test_no_module_keeps_its_own_list_of_families():
    """(``tests/`` and the generated fingerprints may list what they test; the package may not.)"""
    lists = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := _hand_lists(p.read_text()))}
    assert not lists, lists
    assert _hand_lists('FAMILIES = ("sana_video", "wan", "ltx2")\n') == [1]  # the check sees one


def test_a_new_family_is_its_package_alone(tmp_path):
    """A family package dropped under accelpatch.models (here: a folder added to the package's path, in a fresh
    process) is found by the adapters, tiny recipes and the demo without any other file changing."""
    package = tmp_path / "toy_family"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        from accelpatch.models.families import DemoSettings, Family, register

        register(Family(key="toy_family", name="Toy", cli="toy", adapter=f"{__name__}.adapter:ToyAdapter", order=99,
                        demo=DemoSettings("sol", None, steps=2, rounds=6)))
        '''))
    (package / "adapter.py").write_text(textwrap.dedent('''
        from accelpatch.core.adapter import ModelAdapter

        class ToyAdapter(ModelAdapter):
            family = "Toy"
            model_classes = (("torch.nn", "Bilinear"),)
        '''))
    code = textwrap.dedent(f'''
        import accelpatch.models, torch
        accelpatch.models.__path__.append({str(tmp_path)!r})
        from accelpatch.models.registry import find_adapter
        from accelpatch.recipes import TINY_MODELS
        from accelpatch.tools import demo_sections
        assert type(find_adapter(torch.nn.Bilinear(2, 2, 2))).__name__ == "ToyAdapter"
        assert TINY_MODELS[-1] == "toy" and list(demo_sections.MODELS)[-1] == "toy"
        print("ok")
        ''')
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]

"""Every family declares its sites in the one table style (issue #33): a non-empty ``sites`` tuple of ``SiteRule``
read by the base class's one ``iter_sites``, which no adapter overrides; adapters override only the declared
extension points; and each table yields, on the tiny test models, the rows the hand-written finders yielded before
(written out below as literals, from the code before the tables: not computed by the code under test)."""
import re

import pytest
import torch

from accelpatch.core.adapter import NO_BACKEND, CacheSupport, ModelAdapter, SiteRule
from accelpatch.models.registry import ADAPTERS
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.sol_attn.config import SolAttnConfig
from accelpatch.testing import (tiny_ltx2_transformer, tiny_minimax_h3_transformer, tiny_sana_video2_transformer,
                                tiny_sana_video_transformer, tiny_wan_transformer)

TIER = {"exact": 0, "lossless": 1, "high": 2}


def _stacks(adapter, model, backend):
    """What the patcher mounts: per module, in the order modules first appear, its (fusion, tier, layer) rows with
    the highest tier first (stable among equal tiers)."""
    grouped = {}
    for path, module, fast_path, layer in adapter.iter_sites(model, adapter.complete_backend(backend, model)):
        grouped.setdefault(path, []).append((fast_path.fusion.name, str(fast_path.tier), layer))
    return [(path, sorted(rows, key=lambda row: -TIER[row[1]])) for path, rows in grouped.items()]


def _model(factory):
    torch.manual_seed(0)
    model = factory()
    return model[0] if isinstance(model, tuple) else model


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.family)
def test_every_family_declares_its_sites_in_one_table(adapter):
    assert isinstance(adapter.sites, tuple) and adapter.sites, adapter.family
    assert all(isinstance(rule, SiteRule) for rule in adapter.sites), adapter.family
    assert all(rule.backend in (None, NO_BACKEND, *adapter.backends) for rule in adapter.sites), adapter.family
    overriding = [k.__name__ for k in type(adapter).__mro__ if k is not ModelAdapter and "iter_sites" in vars(k)]
    assert overriding == [], f"{adapter.family}: iter_sites written by hand in {overriding}"
    assert isinstance(adapter.cache, CacheSupport)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.family)
def test_adapters_override_only_the_declared_extension_points(adapter):
    for klass in type(adapter).__mro__:
        if klass in (ModelAdapter, object):
            break
        base = SolAttnAdapter if issubclass(klass, SolAttnAdapter) and klass is not SolAttnAdapter else ModelAdapter
        for name in vars(klass):
            if name.startswith("_") or name == "EXTENSION_POINTS":
                continue
            inherited = any(name in vars(k) for k in base.__mro__)
            assert not inherited or name in base.EXTENSION_POINTS, (
                f"{klass.__name__}.{name} overrides something that is not an extension point of {base.__name__}")


def test_the_extension_point_count_is_the_one_the_docstring_gives():
    points = ModelAdapter.EXTENSION_POINTS
    assert len(points) == len(set(points)) == 14
    assert "(14;" in ModelAdapter.__doc__
    public = {name for name in vars(ModelAdapter) if not name.startswith("_") and name != "EXTENSION_POINTS"}
    helpers = {"class_names", "matches", "iter_sites", "default_tier", "option_names", "resolve_options",
               "backend_unavailable_reason", "validate_cache", "uses_steps", "cp_plan", "prepare_parallel"}
    assert public == set(points) | helpers  # a new public name is an extension point or a helper, said here
    assert all(name in points or name in helpers for name in public)


def test_a_site_rule_mounts_by_backend_and_predicate():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    fast_path = object()
    rules = {"any": SiteRule(r"(\d+)", fast_path), "sol": SiteRule(r"(\d+)", fast_path, backend="sol_attn"),
             "none": SiteRule(r"(\d+)", fast_path, backend=NO_BACKEND),
             "linear": SiteRule(r"\d+", fast_path, when=lambda m: isinstance(m, torch.nn.Linear))}
    sol = SolAttnConfig()
    assert [(r.applies(None), r.applies(sol)) for r in rules.values()] == [
        (True, True), (False, True), (True, False), (True, True)]
    assert rules["any"].layer("1", model[1]) == (True, 1) and rules["any"].layer("x1", model[1]) == (False, None)
    assert rules["linear"].layer("0", model[0]) == (True, None)  # no group: no layer index
    assert rules["linear"].layer("1", model[1]) == (False, None)
    assert isinstance(rules["any"].pattern, re.Pattern)



def test_a_site_row_naming_a_backend_its_family_does_not_take_is_refused():
    """A typo in a site table ("sol_atn") would mount nothing, silently: iter_sites names the row instead."""
    class Typo(ModelAdapter):
        family = "typo"
        backends = ("sol_attn",)
        sites = (SiteRule(r"(\d+)", object(), backend="sol_atn"),)

    with pytest.raises(ValueError, match=r"names backend 'sol_atn', which this family does not take; its backends: "
                                         r"'sol_attn'"):
        list(Typo().iter_sites(torch.nn.Sequential(torch.nn.Linear(2, 2)), SolAttnConfig()))


WAN_LOSSLESS = [
    ("blocks.0", [("wan_fused_block", "lossless", 0)]),
    ("blocks.0.attn1", [("wan_fused_attention", "lossless", 0)]),
    ("blocks.0.ffn.net.0", [("fused_gelu", "lossless", 0)]),
    ("blocks.1", [("wan_fused_block", "lossless", 1)]),
    ("blocks.1.attn1", [("wan_fused_attention", "lossless", 1)]),
    ("blocks.1.ffn.net.0", [("fused_gelu", "lossless", 1)]),
]
WAN_SOL_ATTN = [
    ("blocks.0", [("wan_fused_block", "lossless", 0)]),
    ("blocks.0.attn1", [("wan_sol_attn", "high", 0), ("wan_fused_attention", "lossless", 0)]),
    ("blocks.0.ffn.net.0", [("fused_gelu", "lossless", 0)]),
    ("blocks.1", [("wan_fused_block", "lossless", 1)]),
    ("blocks.1.attn1", [("wan_sol_attn", "high", 1), ("wan_fused_attention", "lossless", 1)]),
    ("blocks.1.ffn.net.0", [("fused_gelu", "lossless", 1)]),
    ("blocks.0.attn2", [("wan_cross_attention", "high", 0)]),
    ("blocks.1.attn2", [("wan_cross_attention", "high", 1)]),
]


def _sana_video2(anchor):
    rows = []
    for i in range(3):
        rows += [(f"blocks.{i}", [("sana_video2_fused_block", "lossless", i)]),
                 (f"blocks.{i}.attn", [("sana_video2_linear_attention", "high", i),
                                       ("sana_video2_fused_linear_attention", "lossless", i)])]
    return rows + [("blocks.3", [("sana_video2_fused_block", "lossless", 3)]),
                   ("blocks.3.attn", [(anchor, "high", 3), ("sana_video2_fused_softmax_attention", "lossless", 3)])]


SANA_VIDEO = [row for i in (0, 1) for row in (
    (f"transformer_blocks.{i}", [("sana_video_fused_block", "lossless", i)]),
    (f"transformer_blocks.{i}.attn1", [("sana_video_linear_attention", "high", i),
                                       ("sana_video_fused_linear_attention", "lossless", i)]),
    (f"transformer_blocks.{i}.ff", [("sana_video_fused_glumb", "lossless", i)]))]

#: MiniMax-H3's hand-written finder listed the refiner rows first (the model registers token_refiner before its
#: blocks); the table lists a backend's own rows after the lossless ones, as every SolAttnAdapter table did
MINIMAX_H3_SOL_ATTN = [row for i in (0, 1) for row in (
    (f"transformer_blocks.{i}", [("minimax_h3_fused_block", "lossless", i)]),
    (f"transformer_blocks.{i}.attn", [("sol_attn", "high", i), ("minimax_h3_fused_attention", "lossless", i)]),
    (f"transformer_blocks.{i}.ff.net.0", [("fused_swiglu", "lossless", i)]))] + [
    (f"token_refiner.refiner_blocks.{i}.attn", [("sol_attn_refiner", "high", None)]) for i in (0, 1)]

LTX2_SOL_ATTN = [row for i in (0, 1) for row in (
    (f"transformer_blocks.{i}", [("ltx2_fused_block", "lossless", i)]),
    (f"transformer_blocks.{i}.attn1", [("ltx2_sol_attn", "high", i), ("ltx2_fused_attention", "lossless", i)]),
    (f"transformer_blocks.{i}.ff.net.0", [("fused_gelu", "lossless", i)]),
    (f"transformer_blocks.{i}.audio_ff.net.0", [("fused_gelu", "lossless", i)]))] + [(f"transformer_blocks.{i}.{name}", [("ltx2_dense_attention", "high", i)]) for i in (0, 1) for name in (
    "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")]


@pytest.mark.parametrize("factory, backend, expected", [
    (tiny_wan_transformer, None, WAN_LOSSLESS),
    (tiny_wan_transformer, SolAttnConfig(), WAN_SOL_ATTN),
    (tiny_sana_video2_transformer, None, _sana_video2("sana_video2_softmax_attention")),
    (tiny_sana_video2_transformer, SolAttnConfig(), _sana_video2("sana_video2_sol_attn")),
    (tiny_sana_video_transformer, None, SANA_VIDEO),
    (tiny_minimax_h3_transformer, SolAttnConfig(), MINIMAX_H3_SOL_ATTN),
    (tiny_ltx2_transformer, SolAttnConfig(), LTX2_SOL_ATTN),
], ids=["wan", "wan-sol_attn", "sana_video2", "sana_video2-sol_attn", "sana_video", "minimax_h3-sol_attn",
        "ltx2-sol_attn"])
def test_each_site_table_yields_the_rows_of_before(factory, backend, expected):
    from accelpatch.models.registry import find_adapter

    model = _model(factory)
    assert _stacks(find_adapter(model), model, backend) == expected

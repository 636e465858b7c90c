"""What tests/test_family_contract.py's checks are made of: the tiny builders of a family by the naming convention,
reading a forward's or a pipeline call's tensors, raw-bit comparison, the site table's modules, the state
``remove()`` must give back, and the counts of a report."""
from __future__ import annotations

import copy
import inspect
import io
import warnings
from types import SimpleNamespace

import pytest
import torch

import accelpatch
from accelpatch import testing
from accelpatch.models.families import families
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.sol_attn.config import NOTHING_SKIPPED

FAMILIES = families()
SOL_FAMILIES = tuple(f for f in FAMILIES if issubclass(f.adapter_class(), SolAttnAdapter))
#: sparse from the first step and layer on, at every length (the tiny models' sequences are shorter than the default
#: min_tokens floor, under which every call runs dense)
SPARSE = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
BUILDERS = ("tiny_{key}_transformer", "{key}_transformer_inputs", "tiny_{key}_pipeline", "{key}_pipeline_call_kwargs")
INT_VIEWS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
             torch.float64: torch.int64}
LOSSLESS_ADMITS_NO_HIGH, EXACT_ADMITS_NO_HIGH = "tier lossless does not admit high", "tier exact does not admit high"
EXACT_ADMITS_NO_LOSSLESS = "tier exact does not admit lossless"


def backends(family) -> set:
    """The backends ``apply(backend=...)`` offers for the family's model classes."""
    supported = accelpatch.supported_models()
    return {b for _, name in family.adapter_class().model_classes for b in supported.get(name, ())}


def with_and_without(families_) -> list:
    """(family, None) for every family, then (family, "sol_attn") for ``families_``."""
    return ([pytest.param(f, None, id=f"{f.key}-no-backend") for f in FAMILIES]
            + [pytest.param(f, "sol_attn", id=f"{f.key}-sol_attn") for f in families_])


def tiny(family) -> SimpleNamespace:
    """The family's four tiny builders, by the naming convention (a missing one fails, naming it)."""
    found = []
    for pattern in BUILDERS:
        name = pattern.format(key=family.key)
        if not callable(getattr(testing, name, None)):
            pytest.fail(f"family {family.key!r} is registered but accelpatch.testing has no {name}: add "
                        f"accelpatch/testing/{family.key}.py with its four tiny builders and export them "
                        "(accelpatch/models/families.py)")
        found.append(getattr(testing, name))
    return SimpleNamespace(**dict(zip(("transformer", "inputs", "pipeline", "call_kwargs"), found)))


def outputs(result) -> tuple:
    """Every tensor a forward or pipeline call returned, in order (LTX-2's video and audio, ...)."""
    if isinstance(result, torch.Tensor):
        return (result,)
    values = result if isinstance(result, tuple) else (
        result.values() if hasattr(result, "values") else vars(result).values())
    found = tuple(v for v in values if isinstance(v, torch.Tensor))
    assert found, f"no tensor in {type(result).__name__}"
    return found


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, strides and raw bits (-0.0 is not 0.0, a NaN equals only its own bits)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    view = INT_VIEWS.get(a.dtype)
    return torch.equal(a.view(view), b.view(view)) if view is not None else torch.equal(a, b)


def all_same(outs: tuple, reference: tuple) -> bool:
    return len(outs) == len(reference) and all(same_bits(o, r) for o, r in zip(outs, reference))


def forward(model, inputs) -> tuple:
    with torch.no_grad():
        return outputs(model(**inputs))


def quiet_apply(target, **options):
    """``accelpatch.apply`` without its not-mounted warnings (a CUDA-only fast path on this CPU): what did not mount
    is in the report, which the tests read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="accelpatch: ", category=RuntimeWarning)
        return accelpatch.apply(target, **options)


def calls(site) -> int:
    return site.fast_calls + sum(site.reference_calls.values()) + sum(site.fallback_calls.values())


def sol_sites(report) -> list:
    """The Sol-Attn sites (kind ``<family>_sol_attn``, or ``sol_attn``): the sparse self-attention."""
    return [s for s in report.sites if s.kind.endswith("sol_attn")]


def sol_attn_runs(sites) -> int:
    """Calls that ran the Sol-Attn op: the fast ones and those whose blocks were all exact (skipped nothing)."""
    return sum(s.fast_calls + s.reference_calls.get(NOTHING_SKIPPED, 0) for s in sites)


def counts(report) -> dict:
    return {(s.path, s.kind): (s.fast_calls, s.reference_calls, s.fallback_calls) for s in report.sites}


def table_sites(family, model, backend) -> set:
    """(path, kind) of every module the family's site table names under ``backend`` (None: no backend)."""
    expected, config = set(), None if backend is None else SimpleNamespace(name=backend)
    for rule in family.adapter_class().sites:
        if rule.applies(config):
            expected |= {(path, rule.fast_path.fusion.name) for path, module in model.named_modules()
                         if rule.layer(path, module)[0]}
    return expected


def sol_site_layers(family, model) -> dict:
    """{path: layer index} of the Sol-Attn sites the family's site table names on ``model``."""
    layers = {}
    for rule in family.adapter_class().sites:
        if rule.applies(SimpleNamespace(name="sol_attn")) and rule.fast_path.fusion.name.endswith("sol_attn"):
            for path, module in model.named_modules():
                found, index = rule.layer(path, module)
                if found:
                    layers[path] = index
    return layers


def module_state(model) -> dict:
    """What ``remove()`` must give back: each module's class and processor, the hooks, and the tensors."""
    return {"classes": [(name, type(m)) for name, m in model.named_modules()],
            "processors": [(name, m.processor) for name, m in model.named_modules() if hasattr(m, "processor")],
            "hooks": [(name, len(m._forward_pre_hooks), len(m._forward_hooks), "_diffusers_hook" in m.__dict__)
                      for name, m in model.named_modules()],
            "tensors": {k: v.clone() for k, v in model.state_dict().items()}}


def check_restored(model, before: dict) -> None:
    after = module_state(model)
    assert after["classes"] == before["classes"]
    assert [(n, id(p)) for n, p in after["processors"]] == [(n, id(p)) for n, p in before["processors"]]
    assert after["hooks"] == before["hooks"]
    assert after["tensors"].keys() == before["tensors"].keys()
    assert all(same_bits(v, before["tensors"][k]) for k, v in after["tensors"].items())
    leftovers = {name: k for name, m in model.named_modules() for k in vars(m) if k.startswith(("_accelpatch", "_sgl"))}
    assert not leftovers, leftovers
    assert not hasattr(model, "_accelpatch_state") and accelpatch.report(model).models == ()


def takes(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def pipeline_call(family, builders, pipe) -> dict:
    """Fresh call arguments (a fresh seeded generator) for the tiny pipeline, asking for tensors as the family's
    recipe settings say."""
    own = {"pipeline": pipe} if takes(builders.call_kwargs, "pipeline") else {}
    return {**builders.call_kwargs(**own), **dict(family.recipe.output)}


def run_pipeline(family, builders, pipe) -> tuple:
    return outputs(pipe(**pipeline_call(family, builders, pipe)))


def module_bits(pipe) -> dict:
    """Every tensor of every module component, by component and name."""
    return {f"{name}.{key}": tensor for name, component in pipe.components.items()
            if isinstance(component, torch.nn.Module) for key, tensor in component.state_dict().items()}


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same_bits(x, b[k]) for k, x in a.items())


def transformer_forwards(pipe) -> tuple[list, callable]:
    """A counter of the pipeline's transformer forwards, and what removes it."""
    seen = [0]
    handle = pipe.transformer.register_forward_pre_hook(lambda *args: seen.__setitem__(0, seen[0] + 1))
    return seen, handle.remove


def check_copies_keep_the_bits(m, inputs, patched: tuple, reference: tuple, one_call: dict) -> None:
    """A deepcopy and a torch.save/load round trip of the patched ``m`` give ``patched`` with counts of their own
    (``one_call``'s; the original's stay untouched), and ``remove()`` takes each back to ``reference``."""
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(m), torch.load(buffer, weights_only=False)):
        accelpatch.report(other, reset=True)
        assert all_same(forward(other, inputs), patched)
        assert counts(accelpatch.report(other)) == one_call
        assert all(calls(s) == 0 for s in accelpatch.report(m).sites)  # the copy counts for itself
        accelpatch.remove(other)
        assert all_same(forward(other, inputs), reference) and accelpatch.report(other).models == ()

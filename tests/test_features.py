"""#41: the core hosts features (accelpatch.core.features). A feature registered from outside the core gets its
apply() argument and options, attaches to each patched model, is undone by remove() (also when apply() fails half
way), and fills its section of the report; the core's own features (step cache, parallelism, the CPU-kernel switch,
the Sol-Attn backend) are registered the same way."""
import pytest
import torch

import accelpatch
from accelpatch.core import features
from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs


class _Counter:
    def __init__(self, model, every):
        self.calls, self.every = 0, every
        self.handle = model.register_forward_pre_hook(self.count)

    def count(self, module, args):
        self.calls += 1

    def remove(self):
        self.handle.remove()


class CallCounter(features.Feature):
    name = "call_counter"
    argument = "count_calls"
    default = False
    owner = "call counter"
    use = "with count_calls=True"
    report_field = "calls"

    def option_names(self):
        return ("count_every",)

    def resolve(self, value, options):
        if isinstance(value, tuple):  # its own config, given back by patched() and tune
            return value
        if value is None:
            value = False
        if not isinstance(value, bool):
            raise ValueError(f"count_calls must be True or False, got {value!r}")
        if options and not value:
            raise ValueError(f"{sorted(options)} need count_calls=True")
        return (value, options.get("count_every", 1)) if value else None

    def attach(self, model, patch, config, pipeline):
        if config is None:
            return None
        if config[1] == "boom":
            raise RuntimeError("attach failed")
        return _Counter(model, config[1])

    def report(self, model, patch, reset):
        counter = patch.attached.get(self.name)
        return None if counter is None else counter.calls

    def report_line(self, calls):
        return f"forward calls counted: {calls}"


@pytest.fixture
def counter_feature():
    feature = features.register(CallCounter())
    yield feature
    features.unregister(feature.name)


def test_a_registered_feature_gets_its_argument_attaches_reports_and_is_undone(counter_feature):
    model = tiny_wan_transformer()
    inputs = wan_transformer_inputs(model)
    hooks_before = dict(model._forward_pre_hooks)
    accelpatch.apply(model, count_calls=True, count_every=2)
    patch = model._accelpatch_state
    assert patch.configs["call_counter"] == (True, 2) and patch.attached["call_counter"].every == 2
    with torch.no_grad():
        model(**inputs)
    report = accelpatch.report(model)
    assert report.models[0].sections["calls"] == 1
    assert "forward calls counted: 1" in str(report)
    accelpatch.remove(model)
    assert dict(model._forward_pre_hooks) == hooks_before  # its hook came off with the patch


def test_a_feature_left_off_attaches_nothing_and_its_options_are_listed(counter_feature):
    model = tiny_wan_transformer()
    accelpatch.apply(model)
    assert "call_counter" not in model._accelpatch_state.attached
    assert accelpatch.report(model).models[0].sections["calls"] is None
    accelpatch.remove(model)
    with pytest.raises(ValueError, match=r"call counter \(with count_calls=True\): count_every"):
        accelpatch.apply(model, count_evry=3)
    with pytest.raises(ValueError, match=r"\['count_every'\] need count_calls=True"):
        accelpatch.apply(model, count_every=3)
    with pytest.raises(ValueError, match="count_calls must be True or False, got 'yes'"):
        accelpatch.apply(model, count_calls="yes")
    assert not hasattr(model, "_accelpatch_state")


def test_a_feature_that_fails_to_attach_leaves_the_model_as_it_was(counter_feature):
    model = tiny_wan_transformer()
    classes = [type(m) for m in model.modules()]
    hooks_before = dict(model._forward_pre_hooks)
    with pytest.raises(RuntimeError, match="attach failed"):
        accelpatch.apply(model, count_calls=True, count_every="boom")
    assert [type(m) for m in model.modules()] == classes
    assert dict(model._forward_pre_hooks) == hooks_before and not hasattr(model, "_accelpatch_state")


def test_applying_again_with_another_feature_argument_re_patches(counter_feature):
    model = tiny_wan_transformer()
    accelpatch.apply(model, count_calls=True)
    first = model._accelpatch_state
    accelpatch.apply(model, count_calls=True)
    assert model._accelpatch_state is first  # the same arguments: nothing to do
    accelpatch.apply(model)
    assert model._accelpatch_state is not first and "call_counter" not in model._accelpatch_state.attached
    again = model._accelpatch_state.reapply_arguments()
    assert again["count_calls"] is None  # the config it resolved to: off
    accelpatch.apply(model, count_calls=True, count_every=3)
    accelpatch.apply(model, **model._accelpatch_state.reapply_arguments())  # its own config, taken back as it is
    assert model._accelpatch_state.configs["call_counter"] == (True, 3)
    accelpatch.remove(model)


def test_the_shipped_features_are_registered_not_imported_by_the_core():
    names = [f.name for f in features.registered()]
    assert {"step_cache", "parallel", "cpu_kernels"} <= set(names)
    assert names == sorted(names, key=lambda n: (features.feature(n).order, n))
    from accelpatch.core.backends import available_backends

    assert available_backends() == ["sol_attn"]
    with pytest.raises(KeyError, match="no feature is registered as 'nope'; registered: "):
        features.feature("nope")


def test_a_second_feature_of_another_type_under_one_name_is_refused(counter_feature):
    class Other(features.Feature):
        name = "call_counter"

    with pytest.raises(ValueError, match="a different feature is already registered as 'call_counter'"):
        features.register(Other())

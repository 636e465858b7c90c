"""Hooks other libraries put on patched modules: the model keeps working before and after remove(), and equals a
never-patched model carrying the same hooks.

accelerate, diffusers and plain ``m.forward = m.forward`` capture the module's forward *bound at that moment*.
Added after apply(), they hold the gated forward; remove() must leave them a working model (once, every forward
after remove() raised NotImplementedError from nn.Module's placeholder forward)."""
import fnmatch

import pytest
import torch

import accelpatch
from accelpatch.core.captured_forwards import slots
from accelpatch.core.gated_class import is_gated_forward
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video_transformer)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _rebind(module):
    module.forward = module.forward


def _accelerate_hook(module):
    from accelerate.hooks import ModelHook, add_hook_to_module

    add_hook_to_module(module, ModelHook())


class _Scale:
    """A diffusers ModelHook doubling the module's output (so the hook's presence shows in the result)."""

    @staticmethod
    def make(with_new_forward: bool):
        from diffusers.hooks import ModelHook

        class Double(ModelHook):
            def post_forward(self, module, output):
                return output * 2

        class DoubleWithNewForward(ModelHook):
            def new_forward(self, module, *args, **kwargs):
                return self.fn_ref.original_forward(*args, **kwargs) * 2

        return DoubleWithNewForward() if with_new_forward else Double()


def _diffusers_hook(module, with_new_forward=False):
    from diffusers.hooks import HookRegistry

    HookRegistry.check_if_exists_or_initialize(module).register_hook(_Scale.make(with_new_forward), "double")


HOOKS = {
    "rebind": _rebind,
    "accelerate": _accelerate_hook,
    "diffusers": _diffusers_hook,
    "diffusers-new-forward": lambda m: _diffusers_hook(m, with_new_forward=True),
}


def _sana_sites(model):
    return [block.attn1 for block in model.transformer_blocks]


def _calls_by_kind(model, pattern):
    """{kind: (fast calls, reference calls by reason)} summed over the sites whose path matches ``pattern``."""
    out = {}
    for s in accelpatch.report(model).sites:
        if fnmatch.fnmatchcase(s.path, pattern):
            fast, refs = out.get(s.kind, (0, {}))
            out[s.kind] = (fast + s.fast_calls, {r: refs.get(r, 0) + s.reference_calls.get(r, 0)
                                                 for r in {*refs, *s.reference_calls}})
    return out


#: a hooked attn1 call at the default tier: the high site declines it and hands it to the lossless site below
SANA_ATTN1_ONE_CALL_EACH = {"sana_video_linear_attention": (0, {"tier lossless does not admit high": 2}),
                            "sana_video_fused_linear_attention": (2, {})}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hooks_added_after_apply_keep_working_after_remove(hook):
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    twin = tiny_sana_video_transformer()  # never patched, same weights, same hooks
    for m in _sana_sites(twin):
        HOOKS[hook](m)
    expected = _forward(twin, inputs)

    accelpatch.apply(model)
    for m in _sana_sites(model):
        HOOKS[hook](m)
    assert torch.equal(_forward(model, inputs), expected)
    assert _calls_by_kind(model, "transformer_blocks.*.attn1") == SANA_ATTN1_ONE_CALL_EACH  # the hooked calls went through the gate
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)
    for m in _sana_sites(model):  # no slot keeps the patched forward once accelpatch is gone
        assert not any(is_gated_forward(slot.get(), m) for slot in slots(m))

    accelpatch.apply(model)  # and the hooked model can be patched again
    assert torch.equal(_forward(model, inputs), expected)
    assert _calls_by_kind(model, "transformer_blocks.*.attn1") == SANA_ATTN1_ONE_CALL_EACH


def test_a_forward_captured_in_a_closure_after_apply_delegates_once_removed():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    for m in _sana_sites(model):
        captured = m.forward
        m.forward = (lambda f: (lambda *a, **k: f(*a, **k)))(captured)  # out of accelpatch's reach
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), reference)


def test_cpu_offload_after_apply_then_remove():
    from accelerate import cpu_offload
    from accelerate.hooks import remove_hook_from_submodules

    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    cpu_offload(model, execution_device="cpu")
    assert torch.equal(_forward(model, inputs), reference)
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), reference)
    remove_hook_from_submodules(model)
    assert torch.equal(_forward(model, inputs), reference)


def _h3_inputs(model):
    return minimax_h3_transformer_inputs(model, num_video=300)


def _pab_config():
    from diffusers import PyramidAttentionBroadcastConfig

    return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2,
                                           spatial_attention_block_identifiers=("transformer_blocks",),
                                           spatial_attention_timestep_skip_range=(-1, 2),
                                           current_timestep_callback=lambda: 1)


def test_pyramid_attention_broadcast_on_minimax_h3_after_apply_then_remove():
    model = tiny_minimax_h3_transformer()
    inputs = _h3_inputs(model)
    twin = tiny_minimax_h3_transformer()
    twin.enable_cache(_pab_config())
    expected = [_forward(twin, inputs) for _ in range(3)]  # computes, reuses, computes

    accelpatch.apply(model, backend="sol_attn")
    model.enable_cache(_pab_config())
    with accelpatch.quality("exact"):
        assert all(torch.equal(_forward(model, inputs), e) for e in expected)
    accelpatch.remove(model)
    model._reset_stateful_cache()
    assert all(torch.equal(_forward(model, inputs), e) for e in expected)
    model.disable_cache()
    twin.disable_cache()
    assert torch.equal(_forward(model, inputs), _forward(twin, inputs))


def test_a_diffusers_hook_added_before_apply_is_followed_to_the_gate():
    model = tiny_minimax_h3_transformer()
    inputs = _h3_inputs(model)
    for block in model.transformer_blocks:
        _diffusers_hook(block.attn)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    rep = accelpatch.report(model)
    assert all(s.mounted for s in rep.sites)
    _forward(model, inputs)
    # both hooked attention calls reached the Sol-Attn gate and ran sparse; the lossless site below took none
    assert _calls_by_kind(model, "transformer_blocks.*.attn") == {"sol_attn": (2, {}), "minimax_h3_fused_attention": (0, {})}
    accelpatch.remove(model)
    twin = tiny_minimax_h3_transformer()
    for block in twin.transformer_blocks:
        _diffusers_hook(block.attn)
    assert torch.equal(_forward(model, inputs), _forward(twin, inputs))

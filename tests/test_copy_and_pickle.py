"""A patched model can be deep-copied and pickled: the copy is patched the same way, keeps its own counters, and
remove() on it restores the untouched model without touching the original."""
import copy
import io

import torch

import accelpatch
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video_transformer)


FP32_GLUMB = "activations are torch.float32: GLUMB's fused chains are bfloat16 tables"


def _calls(model):
    """(fast calls of the high sites, reference calls by reason, fast calls of the lossless sites by kind)."""
    sites = accelpatch.report(model).sites
    lossless = {}
    for s in sites:
        if s.tier == "lossless" and s.fast_calls:
            lossless[s.kind] = lossless.get(s.kind, 0) + s.fast_calls
    return (sum(s.fast_calls for s in sites if s.tier == "high"), accelpatch.report(model).reference_calls, lossless)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def test_deepcopy_of_a_patched_sana_video_model():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    _forward(model, inputs)  # one call on each of the 8 sites (2 blocks), counted and copied along with the model
    twin = copy.deepcopy(model)
    assert type(twin.transformer_blocks[0].attn1) is type(model.transformer_blocks[0].attn1)
    assert torch.equal(_forward(twin, inputs), reference)
    # per block and call: the high attn1 site declines at the default tier, the lossless attn1 and block sites run
    # their fused ops, the GLUMB site declines float32 activations
    assert _calls(twin) == (0, {"tier lossless does not admit high": 4, FP32_GLUMB: 4},
                            {"sana_video_fused_block": 4, "sana_video_fused_linear_attention": 4})
    assert _calls(model) == (0, {"tier lossless does not admit high": 2, FP32_GLUMB: 2},  # its own counters
                             {"sana_video_fused_block": 2, "sana_video_fused_linear_attention": 2})
    accelpatch.remove(twin)
    assert type(twin.transformer_blocks[0].attn1).__name__ == "Attention"
    assert type(model.transformer_blocks[0].attn1).__name__ == "GatedAttention"


def test_pickle_round_trip_of_a_patched_model():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model, strict=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert accelpatch.report(loaded).models[0].strict
    assert torch.equal(_forward(loaded, inputs), reference)
    accelpatch.remove(loaded)
    assert torch.equal(_forward(loaded, inputs), reference)


def test_deepcopy_of_a_sol_attn_patched_h3_model_runs_sparse_on_its_own():
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=1100)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    sparse = _forward(model, inputs)
    twin = copy.deepcopy(model)
    assert torch.equal(_forward(twin, inputs), sparse)
    assert len(twin._forward_pre_hooks) == 1
    # both Sol-Attn sites ran sparse twice (the call copied along and the twin's own), as did the fused blocks
    assert _calls(twin)[0] == 4
    assert _calls(twin)[2] == {"minimax_h3_fused_block": 4}
    assert _calls(model)[0] == 2  # the original keeps its own counters
    accelpatch.remove(twin)
    assert not twin._forward_pre_hooks and not twin._forward_hooks
    assert len(model._forward_pre_hooks) == 1  # the original is still patched
    assert torch.equal(_forward(model, inputs), sparse)

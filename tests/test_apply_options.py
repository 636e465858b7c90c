"""apply()'s keyword options (issue #16, items 13 and 14): an unknown one is refused with every valid option of the
call grouped by owner and a close match, naming a backend only where the model runs one; layer lists with empty
entries are refused; impl="triton" that cannot run here is said at apply(); a fast path the options make
impossible warns at apply() (strict=True raises)."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.sol_attn.op import dispatch
from accelpatch.testing import (minimax_h3_transformer_inputs, tiny_minimax_h3_transformer,
                                tiny_sana_video2_transformer, tiny_sana_video_transformer)

CACHE_GROUP = ("step cache (with cache='first_block' or a diffusers config): cache_threshold, cache_warmup_steps, "
               "cache_max_reuse, cache_final_steps")
SOL_NAMES = ("tau, thresh_type, dense_steps, dense_layers, sink_tokens, sink_start, kv_splits, impl, strict, "
             "dense_rows")
FACTORIES = {"sana": tiny_sana_video_transformer, "sana2": tiny_sana_video2_transformer,
             "h3": tiny_minimax_h3_transformer}


def _untouched(model) -> bool:
    return "_accelpatch_state" not in model.__dict__ and not model._forward_pre_hooks and not model._forward_hooks


@pytest.mark.parametrize("family,kwargs,says,never", [
    ("sana", dict(cache="first_block", cache_treshold=0.1),
     ["unknown option(s) ['cache_treshold'] for SanaVideoTransformer3DModel",
      "did you mean 'cache_treshold' → 'cache_threshold'?", "SANA-Video: none of its own", CACHE_GROUP],
     ["backend", "sol_attn"]),
    ("sana", dict(cache="first_block", cache_warmup=1),
     ["did you mean 'cache_warmup' → 'cache_warmup_steps'?", CACHE_GROUP], ["backend", "sol_attn"]),
    ("sana", dict(tau=1.0), ["unknown option(s) ['tau']", CACHE_GROUP], ["backend", "sol_attn"]),
    ("sana2", dict(anchor_fp32_step=2),
     ["did you mean 'anchor_fp32_step' → 'anchor_fp32_steps'?", "SANA-Video 2.0: anchor_fp32_steps, "
      "anchor_fp32_layers", CACHE_GROUP, f"backend 'sol_attn' (with backend='sol_attn'): {SOL_NAMES}"], []),
    ("h3", dict(backend="sol_attn", cache="first_block", cache_treshold=0.1),
     ["unknown option(s) ['cache_treshold'] for MiniMaxH3Transformer3DModel",
      "did you mean 'cache_treshold' → 'cache_threshold'?", f"backend 'sol_attn': {SOL_NAMES}",
      "MiniMax-H3: none of its own", CACHE_GROUP], ["unknown sol_attn option"]),
    ("h3", dict(backend=accelpatch.SolAttnConfig(tau=2.0), taus=1.0),
     ["did you mean 'taus' → 'tau'?", f"backend 'sol_attn' (set inside the SolAttnConfig given): {SOL_NAMES}"], []),
    ("h3", dict(tau=0.5), ["'tau' is an option of backend 'sol_attn': pass it with backend='sol_attn'"], []),
    ("h3", dict(dense_step=0),
     ["did you mean 'dense_step' → 'dense_steps' (backend 'sol_attn', with backend='sol_attn')?"], []),
    ("h3", dict(anchor_fp32_steps=0),
     ["'anchor_fp32_steps' is an option of SANA-Video 2.0 models, not of MiniMax-H3"], []),
])
def test_an_unknown_option_is_named_with_every_valid_one_grouped_by_owner(family, kwargs, says, never):
    model = FACTORIES[family]()
    with pytest.raises(ValueError) as caught:
        accelpatch.apply(model, **kwargs)
    message = str(caught.value)
    for part in says:
        assert part in message, (part, message)
    for part in never:
        assert part not in message, (part, message)
    assert _untouched(model)


def test_a_backend_the_model_cannot_run_is_said_before_its_options():
    model = tiny_sana_video_transformer()
    with pytest.raises(ValueError, match=r"^backend 'sol_attn' is not available for SANA-Video models; backends "
                                         r"available for SANA-Video: none$"):
        accelpatch.apply(model, backend="sol_attn", taus=1.0)
    assert _untouched(model)


def test_a_misspelled_backend_or_cache_gets_a_close_match():
    model = tiny_minimax_h3_transformer()
    with pytest.raises(ValueError, match=r"unknown backend 'sol-atn' \(did you mean 'sol_attn'\?\)"):
        accelpatch.apply(model, backend="sol-atn")
    with pytest.raises(ValueError, match=r"unknown cache 'first_blok' \(did you mean 'first_block'\?\)"):
        accelpatch.apply(model, cache="first_blok")
    assert _untouched(model)


@pytest.mark.parametrize("family,option,value", [
    ("h3", "dense_layers", "0,,1"), ("h3", "dense_layers", "0,"), ("h3", "dense_layers", ",1"),
    ("sana2", "anchor_fp32_layers", "3,,3"),
])
def test_a_layer_list_with_an_empty_entry_is_refused(family, option, value):
    model = FACTORIES[family]()
    backend = {"backend": "sol_attn"} if option == "dense_layers" else {}
    with pytest.raises(ValueError, match=rf"^{option}: {value!r} has an empty entry \(two commas in a row, or a "
                                         r"comma at an end\); use a comma list such as '0,1,3-5', or '' for none$"):
        accelpatch.apply(model, **backend, **{option: value})
    assert _untouched(model)
    assert accelpatch.SolAttnConfig(dense_layers=" ").dense_layers == frozenset()  # blank: none, as ""


@pytest.fixture
def no_triton_here(monkeypatch):
    """A process where impl='triton' cannot run: no CUDA device, no Triton interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_impl_triton_that_cannot_run_here_is_said_at_apply(no_triton_here):
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=100)
    with torch.no_grad():
        reference = model(**inputs).sample
    options = dict(backend="sol_attn", dense_steps=0, dense_layers="", impl="triton")
    with pytest.warns(RuntimeWarning, match=r"sol_attn fast path was not mounted on MiniMaxH3Transformer3DModel: "
                                            r"sol_attn impl='triton' needs CUDA, and no CUDA device is visible"):
        accelpatch.apply(model, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, at apply()
        with torch.no_grad():
            assert torch.equal(model(**inputs).sample, reference)
    (reason, count), = accelpatch.report(model).fallback_calls.items()
    assert count == 2 and "impl='triton' needs CUDA" in reason
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        accelpatch.apply(model, strict=True, **options)
    assert not [w for w in again if "impl='triton'" in str(w.message)]  # said once per process, kind and reason
    with pytest.raises(FastPathUnavailableError, match="impl='triton' needs CUDA"), torch.no_grad():
        model(**inputs)


def test_impl_triton_without_the_triton_package_is_said_at_apply(monkeypatch):
    monkeypatch.setattr(dispatch, "_triton_importable", lambda: False)
    with pytest.warns(RuntimeWarning, match=r"impl='triton' needs the triton package, which does not import"):
        accelpatch.apply(tiny_minimax_h3_transformer(), backend="sol_attn", dense_layers="", impl="triton")


def _apply_quietly(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return accelpatch.apply(model, **kwargs)


def test_dense_layers_over_every_layer_warn_at_apply_and_strict_raises():
    model = tiny_minimax_h3_transformer()  # 2 blocks: the default dense layers 0 and 1 are all of them
    with pytest.warns(RuntimeWarning) as caught:
        accelpatch.apply(model, backend="sol_attn")
    assert [str(w.message) for w in caught] == [
        "accelpatch: sol_attn never runs sparse on MiniMaxH3Transformer3DModel: dense_layers='0-1' (the model's "
        "default, as none were given) cover all 2 of its transformer blocks (0-1); pass dense_layers='' or fewer "
        "layers"]
    assert caught[0].filename == __file__  # the user's line
    _apply_quietly(model, backend="sol_attn")  # applying again changes nothing and says nothing again
    with pytest.warns(RuntimeWarning, match=r"dense_layers='0-1' \(as given\)"):
        accelpatch.apply(model, backend="sol_attn", dense_layers=[1, 0])
    accelpatch.remove(model)
    with pytest.raises(FastPathUnavailableError, match=r"sol_attn never runs sparse .* \(strict=True refuses a fast "
                                                       r"path that can never run\)"):
        accelpatch.apply(model, backend="sol_attn", strict=True)
    with pytest.raises(FastPathUnavailableError, match="never runs sparse"):
        accelpatch.apply(model, backend=accelpatch.SolAttnConfig(dense_layers="0-1", strict=True))
    assert _untouched(model)
    _apply_quietly(model, backend="sol_attn", dense_layers="1", strict=True)


def test_sana_video2_options_that_leave_a_fast_path_nothing_to_do_warn():
    model = tiny_sana_video2_transformer(depth=8)  # anchors 3 and 7
    assert list(model.softmax_layer_indices) == [3, 7]
    with pytest.warns(RuntimeWarning, match=r"the BF16 anchor path never runs on SanaVideo2Transformer3DModel: "
                                            r"anchor_fp32_layers='3,7' cover all 2 of its anchor layers \(3,7\)"):
        accelpatch.apply(model, anchor_fp32_layers="3,7")
    with pytest.raises(FastPathUnavailableError, match="the BF16 anchor path never runs"):
        accelpatch.apply(model, anchor_fp32_layers=[7, 3], strict=True)
    with pytest.warns(RuntimeWarning, match=r"sol_attn never runs sparse on SanaVideo2Transformer3DModel: "
                                            r"dense_layers='3,7' \(as given\) cover all 2 of its anchor layers"):
        accelpatch.apply(model, backend="sol_attn", dense_layers="3,7")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelpatch.apply(model, backend="sol_attn", dense_layers="3", anchor_fp32_layers="3")
    assert not any("never runs" in str(w.message) for w in caught)


def test_sana_video2_without_fp32_attention_has_nothing_to_gain_and_says_so():
    model = tiny_sana_video2_transformer(fp32_attention=False)
    with pytest.warns(RuntimeWarning) as caught:
        accelpatch.apply(model)
    said = [str(w.message) for w in caught if "never runs" in str(w.message)]
    assert said == [
        "accelpatch: the BF16 anchor path never runs on SanaVideo2Transformer3DModel: fp32_attention is off in all 1 "
        "of those layers, so the reference already runs them in the activations' dtype",
        "accelpatch: the BF16-GEMM linear-attention path never runs on SanaVideo2Transformer3DModel: fp32_attention "
        "is off in all 3 of those layers, so the reference already runs them in the activations' dtype"]

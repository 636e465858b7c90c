"""``with accelpatch.patched(pipe, ...)`` patches for one block; ``with accelpatch.apply(pipe):`` (a mistake users
make) fails loudly and leaves nothing patched (once: "'Report' object does not support the context manager
protocol", with the pipeline left patched)."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core.patcher import patch_of
from accelpatch.testing import sana_video_transformer_inputs, tiny_minimax_h3_transformer, tiny_sana_video_transformer


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU rejection of CUDA-only paths
        yield


def _classes(model):
    return [type(m) for m in model.modules()]


def test_patched_patches_for_the_block_only_also_through_an_exception():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    with torch.no_grad():
        reference = model(**inputs).sample
    classes = _classes(model)
    with accelpatch.patched(model, tier="high") as report:
        assert patch_of(model) is not None and len(report.sites) > 0
        assert accelpatch.current_quality(model) == "high"
    assert patch_of(model) is None and _classes(model) == classes
    with pytest.raises(RuntimeError, match="inside"):
        with accelpatch.patched(model):
            raise RuntimeError("inside")
    assert patch_of(model) is None and _classes(model) == classes
    with torch.no_grad():
        assert torch.equal(model(**inputs).sample, reference)


def test_patched_restores_an_earlier_patch():
    model = tiny_minimax_h3_transformer()
    accelpatch.apply(model, backend="sol_attn", tau=2.0)
    with accelpatch.patched(model):
        assert patch_of(model).backend is None
    assert patch_of(model).backend.tau == 2.0
    accelpatch.remove(model)


def test_with_apply_raises_a_clear_error_and_undoes_the_patch():
    model = tiny_sana_video_transformer()
    classes = _classes(model)
    with pytest.raises(TypeError, match=r"not a context manager; the patch it made has been undone.*accelpatch\.patched"):
        with accelpatch.apply(model):
            pass  # never reached
    assert patch_of(model) is None and _classes(model) == classes
    # a report from report() is not an apply(): entering it undoes nothing
    accelpatch.apply(model)
    with pytest.raises(TypeError, match="not a context manager"):
        with accelpatch.report(model):
            pass
    assert patch_of(model) is not None
    accelpatch.remove(model)


def test_strict_apply_warning_says_calls_will_raise():
    model = tiny_sana_video_transformer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelpatch.apply(model, strict=True)
    said = [str(w.message) for w in caught if "was not mounted" in str(w.message)]
    assert said and all("will raise FastPathUnavailableError" in m and "reference path" not in m for m in said), said
    accelpatch.remove(model)

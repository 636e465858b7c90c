"""A patched model pickled in one process loads and runs in another, patched the same way; remove() there restores
the untouched model. (Once, loading failed with KeyError: 'sana_video_linear_attention': the gated class was looked
up in a table that only a process which had itself patched a model had filled.)"""
import json
import subprocess
import sys
import textwrap

import torch

import accelpatch
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video_transformer)

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    torch.set_num_threads(1)
    folder = sys.argv[1]
    results = {}
    for name in ("sana", "h3"):
        saved = torch.load(f"{folder}/{name}.pt", weights_only=False)  # nothing of accelpatch imported yet
        model, inputs = saved["model"], saved["inputs"]
        with torch.no_grad():
            patched = model(**inputs).sample
        import accelpatch
        report = accelpatch.report(model)
        accelpatch.remove(model)
        with torch.no_grad():
            removed = model(**inputs).sample
        results[name] = {
            "patched_equal": torch.equal(patched, saved["patched"]),
            "removed_equal": torch.equal(removed, saved["reference"]),
            "fast_calls": {tier: sum(s.fast_calls for s in report.sites if s.tier == tier)
                           for tier in ("high", "lossless")},
            "reference_calls": report.reference_calls,
            "classes": sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__}),
        }
    print(json.dumps(results))
""")


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def test_pickled_patched_models_load_and_run_in_a_fresh_process(tmp_path):
    sana = tiny_sana_video_transformer()
    sana_inputs = sana_video_transformer_inputs(sana)
    sana_reference = _forward(sana, sana_inputs)
    accelpatch.apply(sana)
    sana_patched = _forward(sana, sana_inputs)
    accelpatch.report(sana, reset=True)  # the counters travel with the model: start the child at zero
    torch.save({"model": sana, "inputs": sana_inputs, "patched": sana_patched, "reference": sana_reference},
               tmp_path / "sana.pt")

    h3 = tiny_minimax_h3_transformer()
    h3_inputs = minimax_h3_transformer_inputs(h3, num_video=1100)
    h3_reference = _forward(h3, h3_inputs)
    accelpatch.apply(h3, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    h3_patched = _forward(h3, h3_inputs)
    assert not torch.equal(h3_patched, h3_reference)  # the sparse path ran, so "equal" below means sparse again
    accelpatch.report(h3, reset=True)
    torch.save({"model": h3, "inputs": h3_inputs, "patched": h3_patched, "reference": h3_reference},
               tmp_path / "h3.pt")

    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    # SANA-Video at the default tier: per block, the fused block and attn1 sites run lossless, the high attn1 site
    # and the GLUMB site (float32 activations) run the reference
    assert results["sana"] == {
        "patched_equal": True, "removed_equal": True, "fast_calls": {"high": 0, "lossless": 4},
        "reference_calls": {"tier lossless does not admit high": 2,
                            "activations are torch.float32: GLUMB's fused chains are bfloat16 tables": 2},
        "classes": ["Attention"]}
    # MiniMax-H3 with Sol-Attn: both blocks' attention ran sparse (high), the fused blocks lossless; the token
    # refiner stays dense and the SwiGLU gate declines float32 activations
    assert results["h3"] == {
        "patched_equal": True, "removed_equal": True, "fast_calls": {"high": 2, "lossless": 2},
        "reference_calls": {"text-only token refiner stays dense": 2,
                            "activations are torch.float32: the fused SiLU tables are bfloat16": 2},
        "classes": ["MiniMaxH3Attention"]}

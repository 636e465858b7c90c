"""What the default tier saves: the lossless fused ops against their eager chains, and whole models patched at the
default tier against the same models unpatched, measured side by side in one run (CPU, one thread).

1. **Per fused op.** The arguments of every fused-op call of one forward of each medium model are recorded; each
   distinct signature is then timed, the device's fused implementation against the reference chain, in interleaved
   rounds (ratio of paired medians with a 95 % interval).
2. **Per model.** SANA-Video, SANA-Video 2.0, MiniMax-H3 and Wan (medium test configs, about 320 video tokens
   each: 5 frames of 16×16 / 8×8 / 16×16 / 16×16 latents; Wan's is :data:`WAN_MEDIUM_CONFIG` here), bf16 and
   fp32: one forward of a patched copy (``apply()``, default tier) against the unpatched model, interleaved rounds;
   the outputs must be ``torch.equal`` in the same run (the script exits 1 if not).
3. **Per pipeline step.** The tiny pipelines with the medium transformers, one denoising step per call, patched
   against unpatched; frames compared with ``torch.equal``.

    python benchmarks/bench_lossless.py [--rounds 15] [--models sana_video,sana_video2,minimax_h3,wan]
                                        [--dtypes bf16,fp32]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
import warnings
from typing import Callable

import torch

import accelpatch
from accelpatch import verify
from accelpatch.tools.stats import compare_timings

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Wan at the other models' medium size: 4 heads x 128 (hidden 512), 4 layers, FFN 1024
WAN_MEDIUM_CONFIG = dict(num_attention_heads=4, attention_head_dim=128, ffn_dim=1024, num_layers=4)


def _models():
    from accelpatch import testing as t

    return {
        "sana_video": (lambda dtype: t.tiny_sana_video_transformer(t.SANA_VIDEO_MEDIUM_CONFIG, dtype=dtype),
                       lambda m: t.sana_video_transformer_inputs(m, num_frames=5, height=16, width=16)),
        "sana_video2": (lambda dtype: t.tiny_sana_video2_transformer(t.SANA_VIDEO2_MEDIUM_CONFIG, dtype=dtype),
                        lambda m: t.sana_video2_transformer_inputs(m, frames=5, height=8, width=8)),
        "minimax_h3": (lambda dtype: t.tiny_minimax_h3_transformer(t.MINIMAX_H3_MEDIUM_CONFIG, dtype=dtype),
                       lambda m: t.minimax_h3_transformer_inputs(m, video_frames=5, height=16, width=16)),
        "wan": (lambda dtype: t.tiny_wan_transformer({**t.WAN_SOL_CONFIG, **WAN_MEDIUM_CONFIG}, dtype=dtype),
                lambda m: t.wan_transformer_inputs(m, num_frames=5, height=16, width=16)),
        "hunyuan_video15": (lambda dtype: t.tiny_hunyuan_video15_transformer(dtype=dtype, num_attention_heads=4,
                                                                             num_layers=4),
                            lambda m: t.hunyuan_video15_transformer_inputs(m, num_frames=5, height=8, width=8)),
    }


def interleaved(baseline: Callable[[], object], candidate: Callable[[], object], *, rounds: int, repeat: int = 1):
    """Per-round seconds of both callables, alternating which goes first."""
    base, cand = [], []
    for r in range(rounds):
        order = ((base, baseline), (cand, candidate)) if r % 2 == 0 else ((cand, candidate), (base, baseline))
        for samples, fn in order:
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            samples.append((time.perf_counter() - start) / repeat)
    return base, cand


@contextlib.contextmanager
def recording_calls():
    """Record ``(op, args)`` of every fused-op call (the first of each signature) while the block runs."""
    seen: dict[tuple, tuple] = {}
    original = verify.FusedOp.__call__

    def spy(self, site, *args):
        seen.setdefault((self.name, verify.signature(args)), (self, args))
        return original(self, site, *args)

    verify.FusedOp.__call__ = spy
    try:
        yield seen
    finally:
        verify.FusedOp.__call__ = original


def bench_ops(name: str, dtype: torch.dtype, rounds: int) -> None:
    build, make_inputs = _models()[name]
    model = build(dtype)
    inputs = make_inputs(model)
    patched = copy.deepcopy(model)
    accelpatch.apply(patched)
    with torch.no_grad(), recording_calls() as seen:
        patched(**inputs)
    for (op_name, _), (op, args) in seen.items():
        fused, unsupported, reason = op.implementation(args[0].device)
        reason = reason or unsupported(op_name, *args)
        label = f"  {op_name:<20} {verify.describe(args)[:70]:<70}"
        if reason is not None:
            print(f"{label} not run: {reason}")
            continue
        base, cand = interleaved(lambda: op.reference(*args), lambda: fused(*args), rounds=rounds, repeat=20)
        comparison = compare_timings(base, cand)
        print(f"{label} eager {comparison.baseline.median * 1e6:7.1f} µs  fused "
              f"{comparison.candidate.median * 1e6:7.1f} µs  {comparison.brief()}")


def bench_model(name: str, dtype: torch.dtype, rounds: int) -> bool:
    build, make_inputs = _models()[name]
    model = build(dtype)
    inputs = make_inputs(model)
    patched = copy.deepcopy(model)
    accelpatch.apply(patched)
    with torch.no_grad():
        expected = model(**inputs).sample
        identical = all(torch.equal(patched(**inputs).sample, expected) for _ in range(2))
        base, cand = interleaved(lambda: model(**inputs), lambda: patched(**inputs), rounds=rounds, repeat=3)
    comparison = compare_timings(base, cand)
    fusions = accelpatch.report(patched).models[0].fusions
    declined = sorted({reason for f in fusions for _, reason, _ in f.declined})
    print(f"  {name:<12} {str(dtype).removeprefix('torch.'):<9} forward unpatched "
          f"{comparison.baseline.median * 1e3:7.2f} ms, default tier {comparison.candidate.median * 1e3:7.2f} ms: "
          f"{comparison.brief()}; outputs torch.equal: {identical}"
          + (f"; declined: {'; '.join(declined)}" if declined else ""))
    return identical


def _pipelines():
    from accelpatch import testing as t

    return {
        "sana_video": lambda: (t.tiny_sana_video_pipeline(transformer_config=t.SANA_VIDEO_MEDIUM_CONFIG, seed=1),
                               lambda: t.sana_video_pipeline_call_kwargs(seed=3, num_inference_steps=1)),
        "sana_video2": lambda: (t.tiny_sana_video2_pipeline(transformer_config=t.SANA_VIDEO2_MEDIUM_CONFIG, seed=1),
                                lambda: t.sana_video2_pipeline_call_kwargs(num_inference_steps=1)),
        "minimax_h3": _minimax_h3_pipeline,
        "wan": lambda: (t.tiny_wan_pipeline(transformer_config={**t.WAN_SOL_CONFIG, **WAN_MEDIUM_CONFIG}, seed=1),
                        lambda: t.wan_pipeline_call_kwargs(num_inference_steps=1, height=128, width=128, num_frames=17,
                                                           output_type="latent")),
    }


def _minimax_h3_pipeline():
    from accelpatch import testing as t

    pipe = t.tiny_minimax_h3_pipeline(transformer_config=t.MINIMAX_H3_MEDIUM_CONFIG, seed=1)
    return pipe, lambda: t.minimax_h3_pipeline_call_kwargs(num_inference_steps=2, pipeline=pipe)


def _frames(output) -> torch.Tensor:
    for name in ("frames", "videos", "video"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no frames tensor in {type(output).__name__}")


def bench_pipeline(name: str, rounds: int) -> bool:
    if name not in _pipelines():  # HunyuanVideo 1.5: no tiny pipeline (it needs Qwen2.5-VL and ByT5 encoders)
        print(f"  {name:<12} no tiny pipeline: skipped")
        return True
    pipe, call = _pipelines()[name]()
    patched_pipe, _ = _pipelines()[name]()
    accelpatch.apply(patched_pipe)
    with torch.no_grad():
        expected = _frames(pipe(**call()))
        identical = torch.equal(_frames(patched_pipe(**call())), expected)
        base, cand = interleaved(lambda: pipe(**call()), lambda: patched_pipe(**call()), rounds=rounds)
    comparison = compare_timings(base, cand)
    print(f"  {name:<12} pipeline call (fp32) unpatched {comparison.baseline.median * 1e3:7.1f} ms, default tier "
          f"{comparison.candidate.median * 1e3:7.1f} ms: {comparison.brief()}; frames torch.equal: {identical}")
    return identical


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default="sana_video,sana_video2,minimax_h3,wan")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: ops, models, pipelines")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # apply() announces the high paths CUDA cannot mount
    names = [n for n in args.models.split(",") if n]
    dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    skip = set(args.skip.split(","))
    ok = True
    if "ops" not in skip:
        print("1. fused ops against their eager chains (interleaved rounds × 20 calls; 95 % interval)")
        for name in names:
            for dtype in dtypes:
                print(f" {name} {str(dtype).removeprefix('torch.')}")
                bench_ops(name, dtype, args.rounds)
    if "models" not in skip:
        print("2. one forward at the default tier against unpatched (interleaved rounds × 3 forwards)")
        for name in names:
            for dtype in dtypes:
                ok &= bench_model(name, dtype, args.rounds)
    if "pipelines" not in skip:
        print("3. one pipeline call at the default tier against unpatched")
        for name in names:
            ok &= bench_pipeline(name, max(5, args.rounds // 2))
    if not ok:
        print("FAILED: an output at the default tier is not bit-identical to the unpatched model", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

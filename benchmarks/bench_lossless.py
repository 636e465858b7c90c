"""What the default tier saves: the lossless fused ops against their eager chains, and whole models patched at the
default tier against the same models unpatched, measured side by side in one run (CPU, one thread).

1. **Per fused op.** The arguments of every fused-op call of one forward of each medium model are recorded; each
   distinct signature is then timed, the device's fused implementation against the reference chain, in interleaved
   rounds (ratio of paired medians with a 95 % interval).
2. **Per model.** SANA-Video, SANA-Video 2.0, MiniMax-H3, Wan, HunyuanVideo 1.5, LTX-2 and LTX-2.3 (its split
   RoPE and gated attention; medium test configs, about 320 video tokens each; Wan's and LTX-2's medium sizes are
   :data:`WAN_MEDIUM_CONFIG` and :data:`LTX2_MEDIUM_CONFIG` here), bf16 and
   fp32: one forward of a patched copy (``apply()``, default tier) against the unpatched model, interleaved rounds;
   the outputs must be ``torch.equal`` in the same run (the script exits 1 if not).
3. **Per pipeline step.** The tiny pipelines with the medium transformers, one denoising step per call, patched
   against unpatched; frames compared with ``torch.equal``.
4. **The ceiling.** The convolutions, GEMMs and attention kernels of one unpatched forward (recorded at the aten
   level, every call with its own arguments) replayed alone, against the whole forward in interleaved rounds. The
   element-wise fusions keep those ops as they are (their reduction order sets the bits), so they cannot make the
   forward faster than ``forward / those ops``.

    python benchmarks/bench_lossless.py [--rounds 15] [--models sana_video,sana_video2,minimax_h3,wan,
                                        hunyuan_video15,ltx2,ltx2_3]
                                        [--dtypes bf16,fp32] [--skip ops,models,pipelines,ceiling]
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
from accelpatch.lossless import verify
from accelpatch.eval.stats import compare_timings

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Wan at the other models' medium size: 4 heads x 128 (hidden 512), 4 layers, FFN 1024
WAN_MEDIUM_CONFIG = dict(num_attention_heads=4, attention_head_dim=128, ffn_dim=1024, num_layers=4)
#: LTX-2 at the same size: video 4 heads x 128 (hidden 512), audio 4 x 32 (hidden 128), 4 layers; 320 video tokens
LTX2_MEDIUM_CONFIG = dict(num_attention_heads=4, cross_attention_dim=512, audio_num_attention_heads=4,
                          audio_cross_attention_dim=128, num_layers=4)


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
        "ltx2": (lambda dtype: t.tiny_ltx2_transformer({**t.LTX2_TINY_CONFIG, **LTX2_MEDIUM_CONFIG}, dtype=dtype),
                 lambda m: t.ltx2_transformer_inputs(m, num_frames=5, height=8, width=8)),
        # LTX-2.3: gated attention and the split RoPE (rope_split_pair) in place of the interleaved one
        "ltx2_3": (lambda dtype: t.tiny_ltx2_transformer({**t.LTX2_3_TINY_CONFIG, **LTX2_MEDIUM_CONFIG}, dtype=dtype),
                   lambda m: t.ltx2_transformer_inputs(m, num_frames=5, height=8, width=8)),
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
        kernel, reason = op.implementation(args[0].device)
        with torch.no_grad():  # as the forward ran it
            reason = reason or kernel.unsupported(*args)
        label = f"  {op_name:<20} {verify.describe(args)[:70]:<70}"
        if reason is not None:
            print(f"{label} not run: {reason}")
            continue
        with torch.no_grad():
            base, cand = interleaved(lambda: op.reference(*args), lambda: kernel.run(*args), rounds=rounds, repeat=20)
        comparison = compare_timings(base, cand)
        print(f"{label} eager {comparison.baseline.median * 1e6:7.1f} µs  fused "
              f"{comparison.candidate.median * 1e6:7.1f} µs  {comparison.brief()}")


def _sample_tensors(output) -> tuple:
    """A forward's outputs to compare: ``sample``, and LTX-2's ``audio_sample`` too."""
    return tuple(getattr(output, n) for n in ("sample", "audio_sample") if getattr(output, n, None) is not None)


def bench_model(name: str, dtype: torch.dtype, rounds: int) -> bool:
    build, make_inputs = _models()[name]
    model = build(dtype)
    inputs = make_inputs(model)
    patched = copy.deepcopy(model)
    accelpatch.apply(patched)
    with torch.no_grad():
        expected = _sample_tensors(model(**inputs))
        identical = all(all(torch.equal(a, b) for a, b in zip(_sample_tensors(patched(**inputs)), expected))
                        for _ in range(2))
        base, cand = interleaved(lambda: model(**inputs), lambda: patched(**inputs), rounds=rounds, repeat=3)
    comparison = compare_timings(base, cand)
    fusions = accelpatch.report(patched).models[0].fusions
    declined = sorted({reason for f in fusions for _, reason, _ in f.declined})
    print(f"  {name:<12} {str(dtype).removeprefix('torch.'):<9} forward unpatched "
          f"{comparison.baseline.median * 1e3:7.2f} ms, default tier {comparison.candidate.median * 1e3:7.2f} ms: "
          f"{comparison.brief()}; outputs torch.equal: {identical}"
          + (f"; declined: {'; '.join(declined)}" if declined else ""))
    return identical


#: the aten ops the lossless tier never replaces (compute whose reduction order sets the bits)
KEPT_OPS = ("convolution", "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention")


class _RecordKept(torch.utils._python_dispatch.TorchDispatchMode):
    """Records ``(op, args, kwargs)`` of every :data:`KEPT_OPS` call (the tensors are kept alive for the replay)."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in KEPT_OPS:
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def bench_ceiling(name: str, dtype: torch.dtype, rounds: int) -> None:
    build, make_inputs = _models()[name]
    model = build(dtype)
    inputs = make_inputs(model)
    patched = copy.deepcopy(model)
    accelpatch.apply(patched)
    with torch.no_grad():
        model(**inputs)
        recorder = _RecordKept()
        with recorder:
            model(**inputs)

        def replay():
            for func, args, kwargs in recorder.calls:
                func(*args, **kwargs)

        forward, kept = interleaved(lambda: model(**inputs), replay, rounds=rounds, repeat=3)
        _, lossless = interleaved(lambda: model(**inputs), lambda: patched(**inputs), rounds=rounds, repeat=3)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    f, k, p = median(forward) * 1e3, median(kept) * 1e3, median(lossless) * 1e3
    print(f"  {name:<12} {str(dtype).removeprefix('torch.'):<9} forward {f:7.2f} ms; its {len(recorder.calls)} "
          f"convolution/GEMM/attention calls alone {k:7.2f} ms ({k / f:.0%}): element-wise fusions cannot beat "
          f"{f / k:.2f}x; the default tier ran {p:7.2f} ms ({f / p:.2f}x), {p - k:+.2f} ms against those ops "
          f"(the unpatched forward: {f - k:+.2f} ms)")


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
        "hunyuan_video15": lambda: (
            t.tiny_hunyuan_video15_pipeline(transformer_config={**t.HUNYUAN_VIDEO15_PIPELINE_CONFIG,
                                                                "num_attention_heads": 4, "num_layers": 4}, seed=1),
            lambda: t.hunyuan_video15_pipeline_call_kwargs(num_inference_steps=1, output_type="latent")),
        "ltx2": lambda: (t.tiny_ltx2_pipeline(transformer_config={**t.LTX2_TINY_CONFIG, **LTX2_MEDIUM_CONFIG}, seed=1),
                         lambda: t.ltx2_pipeline_call_kwargs(num_inference_steps=1, output_type="latent")),
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
    pipe, call = _pipelines()[name]()
    patched_pipe, _ = _pipelines()[name]()
    accelpatch.apply(patched_pipe)
    with torch.no_grad():
        reference, patched = pipe(**call()), patched_pipe(**call())
        identical = torch.equal(_frames(patched), _frames(reference))
        audio = getattr(reference, "audio", None)  # LTX-2's sound (MiniMax-H3's stays in its own output type)
        if isinstance(audio, torch.Tensor):
            identical &= torch.equal(patched.audio, audio)
        base, cand = interleaved(lambda: pipe(**call()), lambda: patched_pipe(**call()), rounds=rounds)
    comparison = compare_timings(base, cand)
    print(f"  {name:<12} pipeline call (fp32) unpatched {comparison.baseline.median * 1e3:7.1f} ms, default tier "
          f"{comparison.candidate.median * 1e3:7.1f} ms: {comparison.brief()}; frames (and audio) torch.equal: {identical}")
    return identical


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default="sana_video,sana_video2,minimax_h3,wan,hunyuan_video15,ltx2,ltx2_3")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: ops, models, pipelines, ceiling")
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
    if "ceiling" not in skip:
        print("4. the ceiling: the convolutions, GEMMs and attention a bit-exact tier keeps, replayed alone")
        for name in names:
            for dtype in dtypes:
                bench_ceiling(name, dtype, args.rounds)
    if not ok:
        print("FAILED: an output at the default tier is not bit-identical to the unpatched model", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU: one SANA-Video 2.0 5B denoising step at 480p, random weights, ``exact`` tier (the baseline the fast paths
are measured against). One prepared run.

Builds the 5B release model (``SanaVideo2Transformer3DModel()`` defaults: 32 layers, 8 FP32 softmax anchors) in
bf16 with random weights directly on the GPU (no downloads), feeds a 480p latent (480×832, 81 frames → 11×15×26 =
4,290 tokens, 128 channels) with classifier-free guidance as one batch of two and a 300-token caption, and times
the forward with CUDA events after warm-up. Also times the anchor layers' attention alone (FP32 SDPA on the
upcast q/k/v, as the release) to show their share. Prints seconds per step, peak memory and the device.

    python benchmarks/gpu_sana_video2_forward.py [--frames 81 --height 480 --width 832] [--repeats 3]
    python benchmarks/gpu_sana_video2_forward.py --dry-run    # the tiny model on CPU: checks the script's logic
"""
from __future__ import annotations

import argparse
import time

import torch

import accelpatch
from accelpatch.testing import SANA_VIDEO2_TINY_CONFIG, tiny_sana_video2_transformer


def timed(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def build(dry_run: bool, device: str):
    if dry_run:
        return tiny_sana_video2_transformer(SANA_VIDEO2_TINY_CONFIG)
    from accelpatch.modeling.sana_video2 import SanaVideo2Transformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = SanaVideo2Transformer3DModel().to(torch.bfloat16)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="the tiny model on CPU")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to check the script on CPU")
    model = build(args.dry_run, device)
    cfg = model.config
    f, h, w = ((args.frames - 1) // 8 + 1, args.height // 32, args.width // 32) if not args.dry_run else (3, 4, 6)
    g = torch.Generator(device=device).manual_seed(0)
    dtype = next(model.parameters()).dtype
    inputs = dict(
        hidden_states=torch.randn(2, cfg.in_channels, f, h, w, generator=g, device=device, dtype=dtype),
        encoder_hidden_states=torch.randn(2, cfg.model_max_length, cfg.caption_channels, generator=g, device=device,
                                          dtype=dtype),
        timestep=torch.full((2,), 700.0, device=device),
        encoder_attention_mask=torch.ones(2, cfg.model_max_length, device=device, dtype=torch.long))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    params = sum(p.numel() for p in model.parameters())
    print(f"SANA-Video 2.0 on {name}: {params / 1e9:.2f}B parameters, {dtype}, latent {f}x{h}x{w} = {f * h * w} "
          f"tokens, CFG batch 2, anchors {model.softmax_layer_indices} (fp32_attention={cfg.fp32_attention})")

    accelpatch.apply(model)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad(), accelpatch.quality("exact"):
        step = timed(lambda: model(**inputs), args.repeats, device)
        anchor = model.blocks[model.softmax_layer_indices[0]].attn
        x = torch.randn(2, f * h * w, cfg.hidden_size, generator=g, device=device, dtype=dtype)
        rope = model.rope_softmax(f, h, w, torch.device(device))
        anchor_s = timed(lambda: anchor(x, rope), args.repeats, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    accelpatch.remove(model)
    anchors = len(model.softmax_layer_indices)
    print(f"exact tier: {step:.3f} s per denoising step (one CFG-batched forward); peak memory {peak:.1f} GiB")
    print(f"one anchor attention module (FP32 core): {anchor_s * 1e3:.1f} ms; all {anchors} anchors ≈ "
          f"{anchors * anchor_s:.3f} s = {100 * anchors * anchor_s / step:.0f} % of the step")


if __name__ == "__main__":
    main()

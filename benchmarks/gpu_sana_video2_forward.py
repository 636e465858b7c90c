"""GPU: SANA-Video 2.0's anchor attention and one 5B denoising step, exact against the fast paths (one prepared
run, random weights, no downloads, under 5 minutes on one H200).

1. One anchor layer at the 720p shape (23,000 tokens: 25×23×40 latents; 10 heads × 256): the attention core as the
   release runs it (SDPA on FP32 q/k/v), on BF16 q/k/v (the ``high`` anchor path) and Sol-Attn over a tau sweep
   (exact fraction, ms, speed-up over FP32, PSNR against FP32). Targets: BF16 ≥ 7.1× over FP32 (prior art), and
   Sol-Attn a further ≥ 2× at the tau that keeps the gate.
2. One 5B denoising step at 480p (11×15×26 = 4,290 tokens, CFG batch 2, 300-token caption), bf16 weights:
   ``exact``; ``high`` with BF16 anchors everywhere (``anchor_fp32_steps=0``); the middle grounds (FP32 anchors in
   half the anchor layers; every anchor FP32, i.e. the linear GEMM path alone); and ``backend="sol_attn"``. Each
   row: seconds per step, speed-up over exact, fast calls, PSNR of the step's output against exact.

    python benchmarks/gpu_sana_video2_forward.py [--repeats 3] [--taus 0.5 1.0 1.5]
    python benchmarks/gpu_sana_video2_forward.py --dry-run    # tiny shapes on CPU: checks the script's logic
"""
from __future__ import annotations

import argparse
import warnings

import torch

import accelpatch
from _gpu import psnr, timed
from accelpatch.testing import SANA_VIDEO2_MEDIUM_CONFIG, tiny_sana_video2_transformer


def build(dry_run: bool, device: str):
    if dry_run:
        return tiny_sana_video2_transformer(SANA_VIDEO2_MEDIUM_CONFIG, dtype=torch.bfloat16)
    from accelpatch.modeling.sana_video2 import SanaVideo2Transformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = SanaVideo2Transformer3DModel()
    return model.to(torch.bfloat16).eval()


def anchor_layer(model, grid, taus, repeats: int, device: str) -> None:
    from accelpatch.modeling.sana_video2.attention import anchor_qkv
    from accelpatch.ops import sol_attn

    f, h, w = grid
    anchor = model.blocks[model.softmax_layer_indices[0]].attn
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, f * h * w, model.config.hidden_size, generator=g, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        q, k, v = anchor_qkv(anchor, x, model.rope_softmax(f, h, w, torch.device(device)))
        sdpa = lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2)
        fp32_s, fp32_out = timed(lambda: sdpa(q.float(), k.float(), v.float()), repeats, device)
        bf16_s, bf16_out = timed(lambda: sdpa(q, k, v), repeats, device)
        print(f"\n1. one anchor layer's attention: {f * h * w} tokens, {anchor.heads} heads × {anchor.head_dim}")
        print(f"{'path':<22}{'ms':>10}{'vs FP32':>10}{'exact frac':>12}{'PSNR dB':>10}")
        print(f"{'FP32 SDPA (release)':<22}{fp32_s * 1e3:>10.2f}{1.0:>9.2f}×{'-':>12}{'inf':>10}")
        print(f"{'BF16 SDPA (high)':<22}{bf16_s * 1e3:>10.2f}{fp32_s / bf16_s:>9.2f}×{'-':>12}"
              f"{psnr(fp32_out, bf16_out):>10.2f}")
        for tau in taus:
            sol_s, (out, stats) = timed(lambda: sol_attn(q, k, v, tau=tau, return_stats=True), repeats, device)
            print(f"{f'Sol-Attn tau={tau}':<22}{sol_s * 1e3:>10.2f}{fp32_s / sol_s:>9.2f}×"
                  f"{stats.exact_fraction:>12.3f}{psnr(fp32_out, out):>10.2f}")


SETTINGS = [  # (label, tier, apply options); the step is past the FP32 steps of the default policy
    ("exact", "exact", {}),
    ("high: BF16 anchors everywhere", "high", dict(anchor_fp32_steps=0)),
    ("high: FP32 anchors in half the layers", "high", "half"),
    ("high: linear GEMM only (anchors FP32)", "high", dict(anchor_fp32_steps=1000)),
    ("high: sol_attn tau=1.0", "high", dict(backend="sol_attn", dense_steps=0, dense_layers="", tau=1.0)),
]


def one_step(model, grid, repeats: int, device: str) -> None:
    f, h, w = grid
    cfg = model.config
    g = torch.Generator(device=device).manual_seed(0)
    inputs = dict(
        hidden_states=torch.randn(2, cfg.in_channels, f, h, w, generator=g, device=device, dtype=torch.bfloat16),
        encoder_hidden_states=torch.randn(2, cfg.model_max_length, cfg.caption_channels, generator=g, device=device,
                                          dtype=torch.bfloat16),
        timestep=torch.full((2,), 700.0, device=device),
        encoder_attention_mask=torch.ones(2, cfg.model_max_length, device=device, dtype=torch.long))
    anchors = model.softmax_layer_indices
    print(f"\n2. one denoising step: {f}x{h}x{w} = {f * h * w} tokens, CFG batch 2, anchors {anchors}")
    print(f"{'setting':<40}{'s/step':>9}{'vs exact':>10}{'fast calls':>12}{'PSNR dB':>10}")
    exact_s = exact_out = None
    for label, tier, options in SETTINGS:
        if options == "half":
            options = dict(anchor_fp32_steps=0, anchor_fp32_layers=anchors[: len(anchors) // 2])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # on a CPU dry run the CUDA-only paths are rejected
            accelpatch.apply(model, **options)
        accelpatch.report(model, reset=True)
        with torch.no_grad(), accelpatch.quality(tier), accelpatch.denoising_step(20):
            step_s, out = timed(lambda: model(**inputs).sample, repeats, device)
        fast = accelpatch.report(model).fast_calls // (repeats + 1)
        if exact_s is None:
            exact_s, exact_out = step_s, out
        print(f"{label:<40}{step_s:>9.3f}{exact_s / step_s:>9.2f}×{fast:>12}{psnr(exact_out, out):>10.2f}")
    accelpatch.remove(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--taus", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to check the script on CPU")
    model = build(args.dry_run, device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    params = sum(p.numel() for p in model.parameters())
    print(f"SANA-Video 2.0 on {name}: {params / 1e9:.2f}B parameters, bf16, fp32_attention={model.config.fp32_attention}")
    anchor_layer(model, (2, 8, 8) if args.dry_run else (25, 23, 40), args.taus, args.repeats, device)
    one_step(model, (2, 8, 8) if args.dry_run else (11, 15, 26), args.repeats, device)
    if device == "cuda":
        print(f"\npeak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()

"""GPU: denoise-step time of MiniMax-H3-shaped layers with and without ``backend="sol_attn"`` (one prepared run).

Builds a MiniMax-H3 transformer with release-shaped layers (56 heads × 128, hidden 5376, FFN 14336; only
``--layers`` of them) in bf16, a packed sequence of ``--rows`` rows (text and audio prefix + video), and times one
transformer forward (= one denoise step of this many layers) dense and with sol_attn (``dense_steps=0``, dense
layers 0,1 as by default), with CUDA events after warm-up. Prints the step-time ratio, the mean exact fraction and
the PSNR of the sparse output against dense. Target from the issue: ≥ 1.3× at PSNR 31–33 dB (prior art: 1.15–1.23×).

    python benchmarks/gpu_minimax_h3_sol_attn.py [--layers 6] [--rows 38000] [--tau 1.0]
    python benchmarks/gpu_minimax_h3_sol_attn.py --dry-run      # tiny shapes on CPU, checks the script's logic
"""
from __future__ import annotations

import argparse

import torch

import accelpatch
from _gpu import psnr, timed
from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer

RELEASE_LAYER = dict(num_attention_heads=56, attention_head_dim=128, hidden_size=5376, ffn_dim=14336,
                     num_refiner_layers=2, in_channels=24, audio_in_channels=32, text_dim=5120, rope_freq_dim=16)
DRY_RUN_LAYER = dict(num_attention_heads=2, attention_head_dim=128, hidden_size=64, ffn_dim=128,
                     num_refiner_layers=1, in_channels=4, audio_in_channels=8, text_dim=8, rope_freq_dim=16)


def _step(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rows", type=int, default=38000, help="video rows of the packed sequence")
    parser.add_argument("--tau", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to check the script on CPU")
    layer = DRY_RUN_LAYER if args.dry_run else RELEASE_LAYER
    rows = 600 if args.dry_run else args.rows
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    config = dict(layer, num_layers=args.layers, patch_size=(1, 2, 2), freq_dim=256, time_embed_hidden_dim=256,
                  time_embed_dim=256 if not args.dry_run else 64)
    model = tiny_minimax_h3_transformer(config, dtype=dtype, device=device)
    inputs = minimax_h3_transformer_inputs(model, num_video=rows, num_text=256 if not args.dry_run else 6,
                                           num_audio=2048 if not args.dry_run else 8)
    seq = inputs["token_tags"].shape[0]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    print(f"MiniMax-H3-shaped layers on {name}: {args.layers} layers, {layer['num_attention_heads']} heads × 128, "
          f"{seq} packed rows, {dtype}")
    dense_s, dense_out = timed(lambda: _step(model, inputs), args.repeats, device)
    print(f"dense: {dense_s * 1e3:.1f} ms per step")
    print(f"{'tau':>6}{'sol ms/step':>14}{'speed-up':>10}{'exact frac':>12}{'PSNR dB':>10}")
    for tau in args.tau:
        accelpatch.apply(model, backend="sol_attn", tau=tau, dense_steps=0)
        sol_s, sol_out = timed(lambda: _step(model, inputs), args.repeats, device)
        fractions = [s.stats["exact_fraction"] for s in accelpatch.report(model).sites if "exact_fraction" in s.stats]
        fallbacks = accelpatch.report(model).fallback_calls
        accelpatch.remove(model)
        frac = sum(fractions) / len(fractions) if fractions else float("nan")
        print(f"{tau:>6}{sol_s * 1e3:>14.1f}{dense_s / sol_s:>9.2f}×{frac:>12.3f}{psnr(dense_out, sol_out):>10.2f}"
              + (f"  fallbacks: {fallbacks}" if fallbacks else ""))


if __name__ == "__main__":
    main()

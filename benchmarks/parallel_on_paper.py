"""Communication per denoising step of split SANA-Video 2.0 (and SANA-Video) at release sizes, on paper, and the
scaling it implies on NVLink. No GPU needed: arithmetic from the model configs and the layer inventory of the
sequence split (what ``accelpatch/parallel/sequence.py`` exchanges per layer, listed below).

Per rank and step, batched CFG (B = 2) or CFG parallel (B = 1 per rank, one output gather per step):

- linear attention: one all-reduce per linear layer of S = Σ v·k̃ᵀ (H·d², FP32) and Σ ReLU(k) (H·d, activation
  dtype); a ring all-reduce moves 2(P−1)/P of it per rank;
- anchors (softmax layers, Ulysses): q, k, v and the output each N·C elements, (P−1)/P² of them sent per rank and
  tensor; FP32 as the release upcasts before the exchange, or BF16 when the upcast is moved after it (bit-identical);
- the output gather at the end: (P−1)/P of the latent-sized prediction.

The implied time: T(P) = T(1)/P + bytes/bandwidth + collectives × latency (compute assumed to split perfectly;
the text encoder and VAE are not counted, nor the padded anchor heads' compute, only their bytes); the last column splits whole frames, so the rank with ceil(F/P) frames sets
the pace (25 latent frames at 720p divide by none of 2, 4, 8). T(1) for the 5B model is the prior art's 364 s / 50 steps on one H200
at the exact tier; the 14B figure is scaled by parameter count (inferred, not measured).

    python benchmarks/parallel_on_paper.py [--bandwidth-gbs 300] [--latency-us 25]
"""
from __future__ import annotations

import argparse

MODELS = {  # hidden C, layers, anchors, linear head dim, softmax head dim, seconds per step on one H200 (B = 2)
    "SANA-Video 2.0 5B": dict(width=2560, depth=32, anchors=8, linear_dim=128, softmax_dim=256, step_s=364 / 50),
    "SANA-Video 2.0 14B": dict(width=4096, depth=40, anchors=10, linear_dim=128, softmax_dim=256,
                               step_s=364 / 50 * (4096 ** 2 * 40) / (2560 ** 2 * 32)),
}
#: 720p × 193 frames through the LTX-2 VAE (stride 8, 32, 32), patch (1, 1, 1): 25 frames of 23 × 40 tokens
FRAMES, TOKENS_PER_FRAME = 25, 23 * 40
OUT_CHANNELS = 128


def per_step(model: dict, world: int, *, batch: int, bf16_anchors: bool, cfg_parallel: bool) -> tuple[float, int]:
    """(bytes sent per rank, collectives) in one denoising step."""
    tokens, width = FRAMES * TOKENS_PER_FRAME, model["width"]
    linear_heads = width // model["linear_dim"]
    linear_layers = model["depth"] - model["anchors"]
    state = linear_heads * model["linear_dim"] ** 2 * 4 + linear_heads * model["linear_dim"] * 2
    sent = collectives = 0.0
    if world > 1:
        sent += linear_layers * batch * state * 2 * (world - 1) / world
        anchor_bytes = 2 if bf16_anchors else 4
        heads = width // model["softmax_dim"]
        padding = -(-heads // world) * world / heads  # zero heads where the degree does not divide them
        sent += model["anchors"] * batch * 4 * tokens * width * padding * anchor_bytes * (world - 1) / world ** 2
        sent += batch * tokens * OUT_CHANNELS * 2 * (world - 1) / world
        collectives += linear_layers + model["anchors"] * 4 + 1
    if cfg_parallel:
        sent += tokens * OUT_CHANNELS * 2  # the other branch's prediction
        collectives += 1
    return sent, int(collectives)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth-gbs", type=float, default=300.0,
                        help="achieved per-GPU NVLink bandwidth for collectives, GB/s (H200 links: 450 GB/s each way)")
    parser.add_argument("--latency-us", type=float, default=25.0, help="fixed cost per collective, µs")
    args = parser.parse_args()
    print(f"720p × 193 frames: {FRAMES} latent frames × {TOKENS_PER_FRAME} tokens = {FRAMES * TOKENS_PER_FRAME} "
          f"tokens; {args.bandwidth_gbs:g} GB/s, {args.latency_us:g} µs per collective")
    print("| model | GPUs | layout | MB sent per rank and step | comm ms/step | step s (1 GPU → split) | speedup | "
          "whole-frame shards |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in MODELS.items():
        heads = model["width"] // model["softmax_dim"]
        for world in (2, 4, 8):
            layouts = [(f"SP{world}", world, 2, False), (f"SP{world} bf16 anchors", world, 2, True)]
            if world > 2:
                layouts.append((f"SP{world // 2}×CFG2 bf16 anchors", world // 2, 1, True))
            else:
                layouts.append(("CFG2", 1, 1, True))
            for label, sp, batch, bf16 in layouts:
                cfg = batch == 1
                sent, calls = per_step(model, sp, batch=batch, bf16_anchors=bf16, cfg_parallel=cfg)
                comm = sent / (args.bandwidth_gbs * 1e9) + calls * args.latency_us * 1e-6
                step = model["step_s"] / world + comm
                padded = -(-heads // sp) * sp
                note = "" if padded == heads else (
                    f" ({heads} anchor heads padded to {padded}: +{(padded / heads - 1) * 100:.0f} % anchor compute)")
                # whole frames per rank: the largest shard, ceil(F / SP) frames, sets the step time
                framed = model["step_s"] / world * (-(-FRAMES // sp) * sp / FRAMES) + comm
                print(f"| {name} | {world} | {label}{note} | {sent / 1e6:,.0f} | {comm * 1e3:.1f} | "
                      f"{model['step_s']:.2f} → {step:.2f} | {model['step_s'] / step:.2f}× | "
                      f"{model['step_s'] / framed:.2f}× |")


if __name__ == "__main__":
    main()

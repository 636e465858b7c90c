"""Several GPUs (NCCL), for when a machine with more than one is lent: one denoising step at release layer shapes,
unsplit on rank 0 vs split over every rank (sequence or CFG parallelism), side by side, random weights, bf16.

    torchrun --nproc_per_node=N benchmarks/gpu/multi_gpu.py [--modes sana_video2_sp,...] [--rounds 5] [--out FILE]
    torchrun --nproc_per_node=2 benchmarks/gpu/multi_gpu.py --dry-run   # CPU, gloo, tiny shapes: the logic only

Shapes: SANA-Video 2B (2 blocks) at 480p with 24 latent frames (81 frames give 21, which splits over 3 or 7 ranks
only, in whole frames), SANA-Video 2.0 5B width (4 blocks: three linear, one anchor) at 720p with 24 latent frames
(193 frames give 25), MiniMax-H3 (2 release-shaped layers) for CFG only; CFG batch 2 throughout. Rank 0 prints a
table and writes JSON: per mode the unsplit and split seconds per step, the speedup and max |Δ| of the split
output against the unsplit one.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_parallel import side_by_side, split_as  # noqa: E402 - the benchmarks folder: one split, one timing loop

MODES = ("sana_video_sp", "sana_video2_sp", "sana_video_cfg", "sana_video2_cfg", "minimax_h3_cfg")


def _build(device: str, factory, config, dtype):
    """``factory`` under ``device`` as the default device: release-width weights are initialised where they run
    (and on meta in the CPU check of this configuration, tests/test_gpu_evidence.py)."""
    with torch.device(device):
        return factory(config, dtype=dtype, device=device)


def _case(family: str, dry_run: bool, device: str):
    from accelpatch import testing as t

    dtype = torch.float32 if dry_run else torch.bfloat16
    if family == "sana_video":
        config = t.SANA_VIDEO_MEDIUM_CONFIG if dry_run else dict(t.SANA_VIDEO_RELEASE_CONFIG, num_layers=2)
        model = _build(device, t.tiny_sana_video_transformer, config, dtype)
        size = dict(num_frames=4, height=8, width=8) if dry_run else dict(num_frames=24, height=60, width=104,
                                                                        text_len=300)
        return model, t.sana_video_transformer_inputs(model, batch_size=2, with_mask=True, **size)
    if family == "sana_video2":
        config = t.SANA_VIDEO2_MEDIUM_CONFIG if dry_run else dict(t.SANA_VIDEO2_5B_CONFIG, depth=4)
        model = _build(device, t.tiny_sana_video2_transformer, config, dtype)
        size = dict(frames=4, height=4, width=4) if dry_run else dict(frames=24, height=23, width=40)
        return model, t.sana_video2_transformer_inputs(model, batch_size=2, **size)
    from _sol import H3_RELEASE_LAYER

    config = t.MINIMAX_H3_MEDIUM_CONFIG if dry_run else dict(H3_RELEASE_LAYER, num_layers=2)
    model = _build(device, t.tiny_minimax_h3_transformer, config, dtype)
    size = dict(num_video=600) if dry_run else dict(num_video=38000, num_text=256, num_audio=2048)
    return model, t.minimax_h3_transformer_inputs(model, batch_size=2, **size)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny shapes")
    parser.add_argument("--out", default="multi_gpu_evidence.json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo" if args.dry_run else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.dry_run:
        torch.set_num_threads(1)
        torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)
        device = "cpu"
    else:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
        torch.cuda.set_device(device)
    rows = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if mode.endswith("_cfg") and world != 2:
            continue  # CFG parallelism splits a batch of 2
        model, inputs = _case(mode.rsplit("_", 1)[0], args.dry_run, device)
        unsplit = copy.deepcopy(model)
        split_as(mode, model, world)
        with torch.no_grad():
            reference = unsplit(**inputs).sample
            out = model(**inputs).sample
            one, split, _, _ = side_by_side(unsplit, model, inputs, args.rounds, lambda: _sync(device), device)
        del unsplit, model
        if rank == 0:
            rows.append(dict(mode=mode, world=world, unsplit_s=statistics.median(one),
                             split_s=statistics.median(split), speedup=statistics.median(one) / statistics.median(split),
                             max_abs_diff=float((out.float() - reference.float()).abs().max())))
            print(f"{mode}: {rows[-1]['unsplit_s']:.4f} s → {rows[-1]['split_s']:.4f} s on {world} ranks "
                  f"({rows[-1]['speedup']:.2f}×), max |Δ| {rows[-1]['max_abs_diff']:.2e}", flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

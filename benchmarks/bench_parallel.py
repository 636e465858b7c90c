"""One denoising step (a transformer forward at batch 2, as batched CFG runs it) on one process vs split over two
(sequence parallelism, or CFG parallelism), side by side in one run on this machine: two gloo processes, one
thread each, medium test models, fp32.

Each round, rank 0 first runs the unsplit model alone (rank 1 waits at a barrier), then both ranks run the split
model; a round's split time is the slower rank's (wall, and the busiest rank's thread CPU time, which a loaded
machine disturbs less). Also printed: the payload bytes each collective kind carried during one split step (per rank,
as handed to the collective; a ring all-reduce moves about 2(P-1)/P of its payload), and max |Δ| of the split
output against the unsplit one.

    python benchmarks/bench_parallel.py [--modes sana_video_sp,sana_video2_sp,sana_video_cfg,...] [--rounds 5]
                                        [--frames 16]
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _models(frames: int = 16):
    from accelpatch import testing as t

    return {
        "sana_video": (lambda: t.tiny_sana_video_transformer(t.SANA_VIDEO_MEDIUM_CONFIG),
                       lambda m: t.sana_video_transformer_inputs(m, batch_size=2, num_frames=frames, height=16,
                                                                 width=16, with_mask=True)),
        # two anchor heads (the medium config has one: Ulysses would pad it to two, half the anchor work wasted)
        "sana_video2": (lambda: t.tiny_sana_video2_transformer(t.SANA_VIDEO2_MEDIUM_CONFIG, softmax_head_dim=128),
                        lambda m: t.sana_video2_transformer_inputs(m, batch_size=2, frames=frames, height=8,
                                                                   width=8)),
        "minimax_h3": (lambda: t.tiny_minimax_h3_transformer(t.MINIMAX_H3_MEDIUM_CONFIG),
                       lambda m: t.minimax_h3_transformer_inputs(m, batch_size=2, video_frames=5, height=16,
                                                                 width=16)),
    }


def split_as(mode: str, model: torch.nn.Module, world: int) -> None:
    """Split ``model`` over the world as ``mode`` says, the way a user would."""
    import accelpatch
    from diffusers import ContextParallelConfig

    family, how = mode.rsplit("_", 1)
    if family != "sana_video2":
        accelpatch.apply(model)
    if how == "sp":
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    else:
        accelpatch.parallel.enable_cfg_parallel(model)


MODES = ("sana_video_sp", "sana_video2_sp", "sana_video_cfg", "sana_video2_cfg", "minimax_h3_cfg")


class PayloadCounter:
    """Bytes handed to each collective while ``counting`` is on (torch.distributed and functional collectives)."""

    NAMES = {dist: ("all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all_single", "batch_isend_irecv",
                    "broadcast")}

    def __init__(self) -> None:
        from torch.distributed import _functional_collectives as funcol

        self.bytes: collections.Counter = collections.Counter()
        self.counting = False
        targets = [(dist, name) for name in self.NAMES[dist]]
        targets += [(funcol, name) for name in ("all_to_all_single", "all_to_all_single_autograd",
                                                "all_gather_tensor", "all_reduce")]
        for module, name in targets:
            if hasattr(module, name):
                setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            if self.counting:
                tensors = (args[0] if name == "batch_isend_irecv" else
                           [args[1]] if name in ("all_gather", "all_gather_into_tensor") else [args[0]])
                for item in tensors:
                    tensor = getattr(item, "tensor", item)
                    if name == "batch_isend_irecv" and getattr(item, "op", None) is not dist.isend:
                        continue
                    if isinstance(tensor, torch.Tensor):
                        self.bytes[name] += tensor.numel() * tensor.element_size()
            return fn(*args, **kwargs)
        return counted


def side_by_side(unsplit, model, inputs: dict, rounds: int, sync=lambda: None, device: str = "cpu"):
    """Per round: rank 0 runs ``unsplit`` alone (the others wait at a barrier), then every rank runs the split
    ``model``. Returns (unsplit s, split s, unsplit CPU s, split CPU s) per round, the split ones the slowest
    rank's; ``sync`` waits for the device (a CUDA synchronize) around each timed call."""
    rank = dist.get_rank()
    one, split, one_cpu, split_cpu = [], [], [], []
    for _ in range(rounds):
        dist.barrier()
        if rank == 0:
            sync()
            start, cpu = time.perf_counter(), time.thread_time()
            unsplit(**inputs)
            sync()
            one.append(time.perf_counter() - start)
            one_cpu.append(time.thread_time() - cpu)
        dist.barrier()
        sync()
        start, cpu = time.perf_counter(), time.thread_time()
        model(**inputs)
        sync()
        elapsed = torch.tensor([time.perf_counter() - start, time.thread_time() - cpu], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        split.append(float(elapsed[0]))
        split_cpu.append(float(elapsed[1]))
    return one, split, one_cpu, split_cpu


def _worker(rank: int, world: int, port: int, mode: str, rounds: int, frames: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)
    counter = PayloadCounter()
    build, make_inputs = _models(frames)[mode.rsplit("_", 1)[0]]
    model = build().eval()
    inputs = make_inputs(model)
    unsplit = copy.deepcopy(model)
    split_as(mode, model, world)
    with torch.no_grad():
        reference = unsplit(**inputs).sample  # warm-up of both
        model(**inputs)
        one, split, one_cpu, split_cpu = side_by_side(unsplit, model, inputs, rounds)
        counter.counting = True
        out = model(**inputs).sample
        counter.counting = False
    if rank == 0:
        torch.save({"one": one, "split": split, "one_cpu": one_cpu, "split_cpu": split_cpu, "bytes": dict(counter.bytes),
                    "max_diff": float((out - reference).abs().max())}, os.path.join(folder, "result.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=16, help="latent frames of the SANA models (even)")
    args = parser.parse_args()
    print("| mode | 1 process s/step | 2 processes s/step | speedup (median, range) | CPU s/step: 1 process → "
          "busiest rank | payload per rank and step | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        with tempfile.TemporaryDirectory() as folder:
            mp.spawn(_worker, args=(2, _free_port(), mode, args.rounds, args.frames, folder), nprocs=2)
            result = torch.load(os.path.join(folder, "result.pt"))
        ratios = sorted(a / b for a, b in zip(result["one"], result["split"]))
        payload = ", ".join(f"{name} {n / 1e6:.2f} MB" for name, n in sorted(result["bytes"].items())) or "none"
        print(f"| {mode} | {statistics.median(result['one']):.3f} | {statistics.median(result['split']):.3f} | "
              f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) | "
              f"{statistics.median(result['one_cpu']):.3f} → {statistics.median(result['split_cpu']):.3f} | {payload} | "
              f"{result['max_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()

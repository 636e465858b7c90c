"""CFG parallelism on CPU: one guided transformer call (batch 2) in one process against the same call split over
two processes (gloo, one thread each), per model (medium random-weight transformers), plus the bytes each rank
sends per call (measured at the all-gather).

Each process runs one thread, so two processes use two cores: the ideal speedup is 2x minus the gather and the
part of the call that does not halve with the batch (embeddings of a shared timestep, per-call overheads). On a
machine whose cores are shared, the numbers move between runs; re-run on idle cores before quoting them.

    python benchmarks/bench_cfg_parallel.py            # ~1 min
    python benchmarks/bench_cfg_parallel.py --calls 10 --json cfg_parallel.json
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

MODELS = ("sana-video", "sana-video2", "minimax-h3")


def _model_and_inputs(name: str):
    from accelpatch import testing as T

    if name == "sana-video":
        model = T.tiny_sana_video_transformer(T.SANA_VIDEO_MEDIUM_CONFIG)
        return model, T.sana_video_transformer_inputs(model, batch_size=2, num_frames=4, height=16, width=16)
    if name == "sana-video2":
        model = T.tiny_sana_video2_transformer(T.SANA_VIDEO2_MEDIUM_CONFIG)
        return model, T.sana_video2_transformer_inputs(model, batch_size=2, frames=4, height=16, width=16)
    model = T.tiny_minimax_h3_transformer(T.MINIMAX_H3_MEDIUM_CONFIG)
    return model, T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=1024)


def _time(model, inputs, calls: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each call (CPU time: this process's own work, whatever else the cores run)."""
    wall, cpu = [], []
    with torch.no_grad():
        model(**inputs)  # warm-up
        for _ in range(calls):
            start, start_cpu = time.perf_counter(), time.process_time()
            model(**inputs)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def _worker(rank: int, world: int, port: int, folder: str, names: list[str], calls: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import accelpatch
    from accelpatch.parallel import cfg

    sent = []
    gather = cfg.dist.all_gather

    def counting(tensors, tensor, group=None):
        sent.append(tensor.numel() * tensor.element_size())
        return gather(tensors, tensor, group=group)

    cfg.dist.all_gather = counting
    out = {}
    for name in names:
        model, inputs = _model_and_inputs(name)
        accelpatch.enable_cfg_parallel(model)
        sent.clear()
        wall, cpu = _time(model, inputs, calls)
        out[name] = {"wall": wall, "cpu": cpu, "bytes_per_call": sent[-1]}
    torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    torch.set_num_threads(1)
    single = {}
    for name in names:
        model, inputs = _model_and_inputs(name)
        single[name] = _time(model, inputs, args.calls)
    with tempfile.TemporaryDirectory() as folder, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(_worker, args=(2, port, folder, names, args.calls), nprocs=2)
        ranks = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in (0, 1)]
    result = {}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'model':<12} {'1 proc B=2 wall':>16} {'2 procs wall':>13} {'speedup':>8} {'1 proc CPU':>11} "
          f"{'CPU per rank':>13} {'bytes sent/call':>16}")
    for name in names:
        one, one_cpu = (statistics.median(t) for t in single[name])
        # a call ends when the slower rank's does: the per-call maximum over ranks
        two = statistics.median(max(t) for t in zip(*(r[name]["wall"] for r in ranks)))
        two_cpu = statistics.median(max(t) for t in zip(*(r[name]["cpu"] for r in ranks)))
        sent = ranks[0][name]["bytes_per_call"]
        result[name] = {"one_process_wall_s": one, "two_processes_wall_s": two, "speedup": one / two,
                        "one_process_cpu_s": one_cpu, "cpu_per_rank_s": two_cpu, "bytes_sent_per_call_per_rank": sent}
        print(f"{name:<12} {one:>16.4f} {two:>13.4f} {one / two:>7.2f}x {one_cpu:>11.4f} {two_cpu:>13.4f} "
              f"{sent:>16,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

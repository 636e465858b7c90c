"""Tests on several real processes (gloo on CPU): a free port, and a script run that spawns the ranks.

A script gets ``folder port *extra`` on its command line and saves each rank's results as ``folder/rank{r}.pt``.
A run that hangs (ranks waiting on each other in a collective) fails at its timeout with its whole process group
killed, instead of holding the test session.
"""
from __future__ import annotations

import os
import signal
import textwrap
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch


#: how a rank script starts its ranks: ``launch(worker, args, nprocs)`` imports what every rank imports (torch,
#: diffusers, accelpatch and its tiny builders: ~8 s of CPU per process on the suite's machines) once, then forks the
#: ranks, which inherit it. Safe here: the parent has run no tensor math (no thread pool to inherit), and each rank
#: joins its gloo group after the fork. ``mp.spawn`` would import everything again in every rank.
#: ``launch`` also ends every rank: a barrier, then leaving the group, so that rank 0, which hosts the group's store,
#: cannot exit while another rank still reads the store (a group created last, e.g. by ``enable_parallelism``, is
#: finished by each rank on its own: without the barrier its peer saw "Connection reset by peer").
LAUNCH = textwrap.dedent("""
    def _rank(index, worker, args):
        worker(index, *args)
        import torch.distributed
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()

    def launch(worker, args, nprocs):
        import accelpatch, accelpatch.testing, diffusers  # noqa: F401  (imported once, inherited by every rank)
        import torch.multiprocessing
        torch.multiprocessing.start_processes(_rank, args=(worker, args), nprocs=nprocs, start_method="fork")
""")

#: the start of a rank script: ``start(rank, world, port)`` joins the gloo group on this machine, one thread per
#: rank; ``launch`` (above) starts the ranks
START = LAUNCH + textwrap.dedent("""
    import os, sys, warnings
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def start(rank, world, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(folder: Path, script: str, world: int, *extra: str, timeout: int = 240) -> list[dict]:
    """Write ``script`` into ``folder``, run it, and load every rank's results (rank order)."""
    path = folder / "ranks.py"
    path.write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(path), str(folder), str(free_port()), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the ranks did not finish within {timeout} s (a hang)")
    # the head too: a rank's own error may come first, then pages of its peers' C++ frames
    assert proc.returncode == 0, stderr if len(stderr) <= 6000 else f"{stderr[:2000]}\n[...]\n{stderr[-4000:]}"
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]

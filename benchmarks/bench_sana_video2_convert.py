"""Time and host memory of loading and converting an original SANA-Video 2.0 checkpoint.

The benchmark builds a synthetic original-format checkpoint in a temporary folder: release width (hidden 2560,
release caption and latent sizes) with fewer layers, in bf16, about 1.2 GB. Each measurement then runs in a fresh
Python process, which reports its wall and CPU time, its RSS after the imports, and its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``, which counts resident pages of a mapped file too). The increase of the peak
over the RSS before loading is given as a multiple of the checkpoint size. The aim is close to one copy of the
weights the model ends up with: 1×, or 2× for the fp32 cast of a bf16 checkpoint. The loaded model owns its
weights (no view of the file), so the load reads every byte: the row "then every weight read" adds no I/O.

Measured:
1. ``from_original_checkpoint`` (.pth, memory-mapped, no cast), then the same after every weight has been read;
2. the same with ``torch_dtype=torch.float32`` (a cast into fp32 tensors that the model owns);
3. ``from_original_checkpoint`` from a ``.safetensors`` copy;
4. ``convert_sana_video2`` (5GB shards), which reads everything and writes it;
5. for comparison, the naive way: build the model on the CPU, ``torch.load`` without mmap, ``load_state_dict``.

    python benchmarks/bench_sana_video2_convert.py [--depth 4] [--tmp DIR] [--no-naive]

The temporary folder is removed at the end.

Issue #16 (the model must own its weights), on a shared 2-core machine; wall s / CPU s / peak increase ÷ checkpoint:

    measurement                      before (views of the file)     after (owned, tensor by tensor)
    .pth, then every weight read     0.66 / 0.43 / 1.00×            2.07 / 1.36 / 1.05×
    .pth, torch_dtype=fp32           7.41 / 4.97 / 3.00×            2.67 / 1.78 / 2.05×
    .safetensors, every weight read  0.81 / 0.49 / 1.00×            1.85 / 1.38 / 1.01×
    convert_sana_video2              1.77 / 1.21 / 1.00×            0.90 / 0.87 / 1.01×

Before, a load was lazy and cheap but its model read the file at every use; after, the load pays for the one copy.
Without releasing the mapped pages as they are copied, the .pth peak would be 2× (measured).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = dict(hidden_size=2560, num_heads=20, in_channels=128, caption_channels=2304, model_max_length=300,
              linear_head_dim=128, softmax_head_dim=256, softmax_ratio=0.25, attn_res_block_size=8, input_size=15)


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def cpu_seconds() -> float:
    """User + system CPU time of this process: unlike wall time, hardly changed by other processes' load."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- child: one measurement in a fresh process ------------------------------------------------------------------


def child(mode: str, checkpoint: str, config: dict, out: str) -> dict:
    import torch

    from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel
    from accelpatch.models.sana_video2.modeling.convert import convert_sana_video2

    torch.set_num_threads(2)
    before, peak_at_start = rss_kib(), peak_kib()
    start, cpu_start = time.perf_counter(), cpu_seconds()
    result: dict = {}
    if mode in ("load", "load-fp32", "load-safetensors"):
        dtype = torch.float32 if mode == "load-fp32" else None
        model = SanaVideo2Transformer3DModel.from_original_checkpoint(checkpoint, config=config, torch_dtype=dtype)
        result["seconds"], result["cpu_seconds"] = time.perf_counter() - start, cpu_seconds() - cpu_start
        result["peak_kib"] = peak_kib()
        result["rss_after_kib"] = rss_kib()
        start, cpu_start = time.perf_counter(), cpu_seconds()
        with torch.no_grad():  # read every weight, so that every page of a mapped file is resident
            total = sum(float(p.sum()) for p in model.parameters())
        result["touch_seconds"] = time.perf_counter() - start
        result["touch_cpu_seconds"] = cpu_seconds() - cpu_start
        result["peak_after_touch_kib"] = peak_kib()
        result["checksum"] = total
        result["dtype"] = str(next(model.parameters()).dtype)
    elif mode == "convert":
        summary = convert_sana_video2(checkpoint, out, config=config, max_shard_size="5GB", progress=False)
        result["seconds"] = time.perf_counter() - start
        result["peak_kib"] = peak_kib()
        result["files"] = len(summary.files)
        result["bytes_on_disk"] = summary.bytes_on_disk
    elif mode == "build":
        pth, safetensors = build_checkpoint(Path(out), config)
        result.update(pth=str(pth), safetensors=str(safetensors), bytes=pth.stat().st_size,
                      parameters=sum(math.prod(s) for s in _shapes(config).values()) - _buffer_elements(config))
    elif mode == "naive":
        model = SanaVideo2Transformer3DModel(**config)
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
        model.load_state_dict(state)
        result["seconds"] = time.perf_counter() - start
        result["peak_kib"] = peak_kib()
    else:
        raise ValueError(mode)
    result.setdefault("seconds", time.perf_counter() - start)
    result.setdefault("cpu_seconds", cpu_seconds() - cpu_start)
    result.update(mode=mode, rss_before_kib=before, peak_before_kib=peak_at_start)
    return result


# -- parent ---------------------------------------------------------------------------------------------------------


def _shapes(config: dict) -> dict:
    from accelpatch.testing import sana_video2_transformer_on_meta

    return {name: tuple(t.shape) for name, t in sana_video2_transformer_on_meta(config).state_dict().items()}


def _buffer_elements(config: dict) -> int:
    shapes = _shapes(config)
    return math.prod(shapes["pos_embed"]) + math.prod(shapes["y_embedder.y_embedding"])


def build_checkpoint(folder: Path, config: dict) -> tuple[Path, Path]:
    """A random bf16 checkpoint in the original format (``{"state_dict": ...}``) and a .safetensors copy."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in _shapes(config).items():
        if name == "pos_embed":
            state[name] = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            fan_in = shape[1] if len(shape) > 1 else 1
            state[name] = (torch.randn(shape, generator=g) / fan_in ** 0.5).to(torch.bfloat16)
    pth = folder / "sana_video2_synthetic.pth"
    torch.save({"state_dict": state}, pth)
    safetensors = folder / "sana_video2_synthetic.safetensors"
    save_file(state, safetensors)
    return pth, safetensors


def run_child(mode: str, checkpoint: Path, config: dict, out: Path) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--checkpoint", str(checkpoint), "--config-json",
               json.dumps(config), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="2")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=4, help="layers of the synthetic checkpoint (default 4)")
    parser.add_argument("--tmp", default=None, help="folder for the temporary files (default: the system's)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--config-json", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.checkpoint, json.loads(args.config_json), args.out)))
        return

    with tempfile.TemporaryDirectory(prefix="bench_sana_video2_convert_", dir=args.tmp) as tmp:
        folder = Path(tmp)
        config = dict(CONFIG, depth=args.depth)
        # built in a child too: this process stays small, so that no child inherits a high RSS peak at its fork
        built = run_child("build", Path(), config, folder)
        pth, safetensors, size, parameters = Path(built["pth"]), Path(built["safetensors"]), built["bytes"], \
            built["parameters"]
        print(f"synthetic checkpoint: hidden {config['hidden_size']}, depth {config['depth']}, bf16, "
              f"{parameters:,} parameters, {size / 1e9:.3f} GB .pth (built in {built['seconds']:.1f} s)")
        plan = [("load", pth), ("load-fp32", pth), ("load-safetensors", safetensors), ("convert", pth)]
        if not args.no_naive:
            plan.append(("naive", pth))
        results = [run_child(mode, checkpoint, config, folder / "diffusers") for mode, checkpoint in plan]

    gib = 1024 ** 2  # KiB per GiB
    size_kib = size / 1024
    print(f"\n{'measurement':<52}{'wall s':>8}{'CPU s':>8}{'RSS before':>12}{'peak RSS':>10}{'increase':>10}"
          f"{'÷ ckpt':>8}")
    labels = {"load": "from_original_checkpoint (.pth, mmap)",
              "load-fp32": "from_original_checkpoint, torch_dtype=fp32",
              "load-safetensors": "from_original_checkpoint (.safetensors)",
              "convert": "convert_sana_video2 (5GB shards)",
              "naive": "naive: model on CPU + torch.load + load_state_dict"}

    def row(label, seconds, cpu, before, peak):
        increase = max(peak - before, 0)
        print(f"{label:<52}{seconds:>8.2f}{cpu:>8.2f}{before / gib:>10.2f} G{peak / gib:>8.2f} G"
              f"{increase / gib:>8.2f} G{increase / size_kib:>7.2f}×")

    for r in results:
        if r["peak_before_kib"] > r["rss_before_kib"] + 100 * 1024:
            print(f"  (warning: {r['mode']} started with a peak RSS {r['peak_before_kib'] / gib:.2f} G above its "
                  "RSS; its increase is understated)")
        row(labels[r["mode"]], r["seconds"], r["cpu_seconds"], r["rss_before_kib"], r["peak_kib"])
        if "peak_after_touch_kib" in r:
            row("  ... then every weight read", r["seconds"] + r["touch_seconds"],
                r["cpu_seconds"] + r["touch_cpu_seconds"], r["rss_before_kib"], r["peak_after_touch_kib"])
    convert = next(r for r in results if r["mode"] == "convert")
    print(f"\nconvert wrote {convert['files']} files, {convert['bytes_on_disk'] / 1e9:.3f} GB; checkpoint "
          f"{size / 1e9:.3f} GB. RSS in GiB; 'increase' = peak RSS - RSS before loading (after the imports); "
          "CPU s = user + system time of the measuring process.")
    print("temporary files removed")


if __name__ == "__main__":
    main()

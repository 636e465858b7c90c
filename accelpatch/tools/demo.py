"""``python -m accelpatch demo``: tiny random pipelines, unpatched next to patched, measured so that it tells the truth.

Six sections, one per family. By default two run: SANA-Video under every tier (its fast path needs CUDA, so on a
CPU its ``high`` row falls back, and the row says so and why), then MiniMax-H3 with ``backend="sol_attn"``
(block-sparse attention, the fast path that does run on a CPU). ``--model`` picks others (one name, a comma list,
or ``all``): SANA-Video 2.0 through the tiers, and Wan 2.x, HunyuanVideo 1.5 and LTX-2 with ``sol_attn`` like
MiniMax-H3 (tier high sparse, ``quality("lossless")`` bit-identical with the fused kernels, ``remove()``).

Everything is built offline with random weights under a fixed seed. Rows are timed in interleaved rounds (every row
once per round, each round starting one row later, so that drift of a shared machine hits all rows alike). The
"vs unpatched" column is :func:`accelpatch.eval.stats.compare_timings` of the per-round samples: a ratio appears
only when its 95% interval excludes 1; otherwise the row reads "noise (low–high×)". A row that asked for a fast
path that could not mount reads "fell back: <reason>" (the reason comes from ``accelpatch.report``).

Output streams: the header prints before the first section is built and each section as soon as it is done, closed
by how long it took (wall and CPU seconds), so a slow machine shows progress and the times in docs/cli.md can be
checked.

Here: the run (:func:`run_demo`) and the command line. The sections, one per family, and how each runs:
:mod:`accelpatch.tools.demo_sections`; the rows, their interleaved rounds and the table:
:mod:`accelpatch.tools.demo_rows`.

Importing this module is cheap (no torch, no diffusers): ``add_arguments`` declares the command line, so that
``--help`` answers at once; torch is imported by the functions that run.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Optional, Sequence, Union

from accelpatch.eval.recipe_cli import at_least
from accelpatch.tools.demo_rows import MIN_ROUNDS, QUALITY_FRAMES, plural
from accelpatch.tools.demo_sections import (DEFAULT_MODELS, MODELS, default_help, parse_models, sana_section,
                                            sol_attn_section)

DTYPE_NAMES = ("auto", "bf16", "fp32")


def _torch_dtype(name: str, device: str):
    import torch  # noqa: PLC0415  (heavy: only when the demo runs)

    if name == "auto":  # a CPU without bf16 matrix units runs bf16 far slower than fp32; GPUs run bf16
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_NAMES)}")
    return dtypes[name]


def _section_time(title: str, wall: float, cpu: float) -> str:
    """The closing line of a section: its wall-clock and CPU seconds (building, calls and scoring included)."""
    return f"-- {title}: {wall:.1f} s wall, {cpu:.1f} s CPU (build, calls and scoring)"


def run_demo(*, steps: Optional[int] = None, dtype: str = "auto", device: str = "cpu", seed: int = 0,
             repeats: Optional[int] = None, progress: bool = True,
             model: Union[str, Sequence[str]] = DEFAULT_MODELS, emit: Optional[Callable[[str], None]] = None,
             videos_dir: Optional[str] = None) -> str:
    """Run the demo's sections (``model``: a key of :data:`MODELS`, a comma list, ``all``, or a sequence of keys)
    and return the report as text. ``steps`` and ``repeats`` (interleaved timing rounds) None: each model's default.
    ``videos_dir``: also run each trained tiny model (Wan, SANA-Video) under exact | lossless | high and write the
    side-by-side PNG and GIF there (:func:`accelpatch.tools.demo_videos.video_section`).
    ``emit`` (e.g. a flushing print) gets the text as it is ready: the header before the first section is built,
    then each section with its time, so a long run shows progress instead of all of it at the end."""
    import torch  # noqa: PLC0415

    from diffusers.utils import logging as diffusers_logging  # noqa: PLC0415

    names = parse_models(model) if isinstance(model, str) else tuple(model)
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ValueError(f"unknown model {', '.join(map(repr, unknown)) or repr(model)}; choose one of "
                         f"{', '.join(MODELS)}")
    torch_dtype = _torch_dtype(dtype, device)
    diffusers_logging.set_verbosity_error()
    dtype_name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[torch_dtype]
    chunks: list[str] = []

    def put(text: str) -> None:
        chunks.append(text)
        if emit is not None:
            emit(text)

    put("\n".join([
        f"accelpatch demo: tiny random-weight pipelines built offline; {device}, {dtype_name}"
        f"{' (auto)' if dtype == 'auto' else ''}, {torch.get_num_threads()} thread(s), seed {seed}; "
        f"{plural(len(names), 'section')}: {', '.join(MODELS[n].title for n in names)}",
        "Rounds run every row once, each starting one row later. s/step: median of the transformer's seconds per "
        "denoising step (VAE decode not included). vs unpatched: median of the per-round ratios with its 95% "
        "interval (order statistics); \"noise\" when the interval contains 1 (a difference this machine cannot tell "
        f"apart). PSNR/SSIM: worst frame against the unpatched frames (at most {QUALITY_FRAMES}, evenly "
        "spaced)."]))
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for name in names:
        spec = MODELS[name]
        wall, cpu = time.perf_counter(), time.process_time()
        section = sana_section if spec.family == "sana" else sol_attn_section
        lines = section(spec, steps=steps or spec.default_steps, dtype=torch_dtype, device=device, seed=seed,
                        rounds=repeats or spec.default_rounds, progress=progress)
        lines.append(_section_time(spec.title, time.perf_counter() - wall, time.process_time() - cpu))
        put("\n".join(["", *lines]))
    if videos_dir is not None:
        from accelpatch.tools.demo_videos import video_section  # noqa: PLC0415

        wall, cpu = time.perf_counter(), time.process_time()
        lines = video_section(videos_dir)
        lines.append(_section_time("Videos", time.perf_counter() - wall, time.process_time() - cpu))
        put("\n".join(["", *lines]))
    if len(names) > 1:
        everything = f"all {len(names)} sections" + (" and the videos" if videos_dir is not None else "")
        put("\n" + _section_time(everything, time.perf_counter() - start_wall, time.process_time() - start_cpu))
    return "\n".join(chunks)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------

positive_int = at_least(1)
non_negative_int = at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the demo's options (no heavy import: ``--help`` stays fast)."""
    parser.add_argument("--model", type=parse_models, default=DEFAULT_MODELS, metavar="MODEL[,MODEL]",
                        help=f"which tiny pipelines to run, in order: {', '.join(MODELS)}, a comma list, or all "
                             f"(default {','.join(DEFAULT_MODELS)}: {default_help()})")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="denoising steps per call, >= 1 (default: "
                             + ", ".join(f"{n} {m.default_steps}" for n, m in MODELS.items()) + ")")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                        help="model dtype (default auto: fp32 on cpu, where bf16 matmuls are slow without bf16 units; "
                             "bf16 on a GPU)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; SANA's high tier needs cuda)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help=f"interleaved timing rounds (every row once per round), >= 1; a speed verdict needs "
                             f">= {MIN_ROUNDS} (default: " + ", ".join(f"{n} {m.default_rounds}" for n, m in
                                                                       MODELS.items()) + ")")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--videos", default="out/demo", metavar="DIR",
                        help="where the trained tiny models' exact | lossless | high videos go, a PNG strip and a GIF "
                             "per model (default out/demo; ~25 s on one thread)")
    parser.add_argument("--no-videos", action="store_true", help="skip the videos")


def device_error(text: str) -> Optional[str]:
    """Why ``--device text`` cannot run the demo on this machine, or None if it can."""
    import torch  # noqa: PLC0415

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        return f"not a torch device string (e.g. cpu, cuda, cuda:0); valid here: {', '.join(_usable_devices())}"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                why = f"CUDA is not available in this torch build ({torch.__version__})"
            else:
                why = f"CUDA is not available (torch {torch.__version__} sees no usable GPU)"
            return f"{why}; valid here: {', '.join(_usable_devices())}"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"CUDA device index must be in [0, {count - 1}], got {device.index}"
        return None
    if device.type in _usable_devices():
        return None
    return f"device type {device.type!r} is not available here; valid here: {', '.join(_usable_devices())}"


def _usable_devices() -> list[str]:
    import torch  # noqa: PLC0415

    names = ["cpu"]
    if torch.cuda.is_available():
        names.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        names.append("xpu")
    return names


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Checks that need torch, run after parsing and before anything is built: ``parser.error`` (exit 2) if bad."""
    reason = device_error(args.device)
    if reason is not None:
        parser.error(f"--device {args.device}: {reason}")


def main(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1) if args.device == "cpu" else None
    run_demo(steps=args.steps, dtype=args.dtype, device=args.device, seed=args.seed, repeats=args.repeats,
             progress=not args.no_progress, model=args.model, emit=lambda text: print(text, flush=True),
             videos_dir=None if args.no_videos else args.videos)
    return 0

"""``accelpatch convert sana-video2 CKPT --out DIR``: turn a released SANA-Video 2.0 checkpoint (original
NVlabs/Sana format) into a diffusers folder that ``SanaVideo2Transformer3DModel.from_pretrained(DIR)`` loads.

Importing this module is cheap (no torch, no diffusers). ``add_arguments`` declares the command line so that
``--help`` answers at once, and ``check_args`` checks every argument it can without torch (the checkpoint file,
the whole ``--config``, the output folder) before ``main`` imports torch and diffusers, which takes seconds. The
work is done by :func:`accelpatch.models.sana_video2.modeling.convert.convert_sana_video2`.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DTYPE_NAMES = ("bf16", "fp16", "fp32")
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
CONFIG_SUFFIXES = (".yaml", ".yml")
_SIZE = re.compile(r"(\d+)(KB|MB|GB|TB)?", re.IGNORECASE)


def shard_size(text: str):
    """argparse type: a shard size as huggingface_hub reads it: a number with KB, MB, GB or TB (powers of 1000),
    or a plain number of bytes (returned as an int)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive size such as 5GB or 500MB (units KB, MB, GB, TB) or a "
                                         f"number of bytes, got {text!r}")
    number, unit = match.groups()
    return f"{int(number)}{unit.upper()}" if unit else int(number)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``convert sana-video2``'s options (no heavy import: ``--help`` stays fast)."""
    parser.add_argument("checkpoint", metavar="CKPT",
                        help="original checkpoint: a torch pickle (.pth/.pt/.bin, opened with weights_only=True) or "
                             ".safetensors")
    parser.add_argument("--config", metavar="CFG",
                        help="the release config.yaml (default: infer the config from the checkpoint's shapes)")
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="output folder (created if needed; its diffusers weight files are replaced)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                        help="cast the weights (default: keep the checkpoint's dtype)")
    parser.add_argument("--max-shard-size", type=shard_size, default="5GB", metavar="SIZE",
                        help="largest safetensors shard: 5GB, 500MB, ... or bytes (default 5GB)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Checks run after parsing and before anything is loaded: ``parser.error`` (exit 2) if an argument is bad."""
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        parser.error(f"CKPT {args.checkpoint}: no such file")
    if checkpoint.suffix.lower() not in CHECKPOINT_SUFFIXES:
        parser.error(f"CKPT {args.checkpoint}: unknown format {checkpoint.suffix or '(no suffix)'!r}; expected "
                     f"{', '.join(CHECKPOINT_SUFFIXES)}")
    if checkpoint.stat().st_size == 0:
        parser.error(f"CKPT {args.checkpoint}: the file is empty (0 bytes), not a checkpoint")
    if args.config is not None:
        config = Path(args.config)
        if not config.is_file():
            parser.error(f"--config {args.config}: no such file")
        if config.suffix.lower() not in CONFIG_SUFFIXES:
            parser.error(f"--config {args.config}: expected the release config.yaml (.yaml or .yml)")
        # the full check of the config, torch-free: what main would find only after importing torch
        from accelpatch.models.sana_video2.release import CheckpointError, sana_video2_config_from_yaml

        try:
            sana_video2_config_from_yaml(config)
        except CheckpointError as error:
            parser.error(f"--config {' '.join(str(error).split())}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {args.out}: exists and is not a directory")


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{count} B"  # pragma: no cover


def summary_text(summary, checkpoint: str) -> str:
    """The report printed at the end of a conversion."""
    dtype = str(summary.dtype).replace("torch.", "")
    return "\n".join([
        f"Converted SANA-Video 2.0 checkpoint {checkpoint}",
        f"  parameters:   {summary.parameters:,} ({dtype})",
        f"  size on disk: {_human_bytes(summary.bytes_on_disk)} in {len(summary.files)} files",
        f"  folder:       {summary.out_dir}",
        "  load it with:",
        "    import torch",
        "    from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel",
        f"    transformer = SanaVideo2Transformer3DModel.from_pretrained({str(summary.out_dir)!r}, "
        f"torch_dtype=torch.{dtype})",
    ])


def main(args: argparse.Namespace) -> int:
    if not args.no_progress:  # the imports take seconds (tens without a bytecode cache): say what is happening
        print("accelpatch convert: importing torch and diffusers ...", file=sys.stderr, flush=True)
    import torch  # noqa: PLC0415  (heavy: only when a conversion runs)

    from accelpatch.models.sana_video2.modeling.convert import convert_sana_video2

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    summary = convert_sana_video2(args.checkpoint, args.out, config=args.config,
                                  torch_dtype=dtypes[args.dtype] if args.dtype else None,
                                  max_shard_size=args.max_shard_size, progress=not args.no_progress)
    print(summary_text(summary, args.checkpoint))
    return 0

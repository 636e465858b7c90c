"""``python -m accelpatch memory --recipe R [--height H --width W --frames F --batch B --dtype D --tier T
--memory low --vae-tiling --gguf FILE --budget 24GiB]``:
a recipe's call planned by stage at full size, on fake tensors (:func:`accelpatch.memory.plan.memory_plan`).

Importing this module imports neither torch nor diffusers: the arguments (the budget's form included) are checked
first, and torch loads when the plan runs. Progress goes to stderr, the table to stdout. Exit code 0 with the plan
printed (whatever the verdict), 2 for a usage or recipe error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accelpatch.core.tiers import Tier
from accelpatch.memory.sizes import FORMS, parse_size


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", required=True, help="a recipe name or YAML file (python -m accelpatch recipes)")
    parser.add_argument("--height", type=_positive, help="pixels (default: the recipe's call, else the pipeline's)")
    parser.add_argument("--width", type=_positive, help="pixels (default: the recipe's call, else the pipeline's)")
    parser.add_argument("--frames", type=_positive, help="video frames (default: the recipe's call)")
    parser.add_argument("--batch", type=_positive, help="videos per prompt (default 1; CFG's batch is added)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default: the recipe's")
    parser.add_argument("--text-tokens", type=_positive, help="text tokens the transformer sees (default: the "
                        "pipeline's padded length; MiniMax-H3 packs the prompt's own, assumed 256)")
    parser.add_argument("--budget", help=f"say whether the call fits this much device memory: {FORMS}")
    parser.add_argument("--tier", choices=[str(tier) for tier in Tier], help="plan the patched step at this tier "
                        "(default: the recipe's; lossless is apply()'s default: bit-identical)")
    parser.add_argument("--memory", choices=("default", "low"), help="plan the patched step with apply(..., "
                        "memory=...): 'low' runs the feed-forwards and query/key norms in chunks of tokens")
    parser.add_argument("--chunk-tokens", type=_positive, help="with --memory low: tokens of each video per chunk "
                        "(apply()'s memory_chunk_tokens; default 8192)")
    parser.add_argument("--vae-tiling", action="store_true", help="plan the VAE decode with vae.enable_tiling() "
                        "(diffusers' default tiles; lossy: measure it with validate, a candidate with vae_tiling)")
    parser.add_argument("--gguf", metavar="FILE", help="also plan the call with the transformer loaded from this GGUF "
                        "file (diffusers' from_single_file with GGUFQuantizationConfig): its header is read, not its "
                        "tensors; a row of its own under the peaks")
    parser.add_argument("--unpatched-only", action="store_true", help="skip the patched transformer step")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The budget's form and the recipe, before torch is imported: one ``error:`` line, exit code 2."""
    from accelpatch.recipes import RecipeError, load_recipe

    if args.budget is not None:
        try:
            args.budget_bytes = parse_size(args.budget)
        except ValueError as error:
            parser.error(str(error))
    if args.gguf is not None and not Path(args.gguf).is_file():
        parser.error(f"--gguf: no file at {args.gguf!r}")
    try:
        args.loaded_recipe = load_recipe(args.recipe)
    except RecipeError as error:
        parser.error(" ".join(str(error).split()))


def main(args: argparse.Namespace) -> int:
    from accelpatch.memory.plan import memory_plan

    plan = memory_plan(getattr(args, "loaded_recipe", None) or args.recipe, height=args.height, width=args.width,
                       frames=args.frames, batch=args.batch, dtype=args.dtype, text_tokens=args.text_tokens,
                       budget=getattr(args, "budget_bytes", None), patched=not args.unpatched_only, tier=args.tier,
                       memory=args.memory, chunk_tokens=args.chunk_tokens, vae_tiling=args.vae_tiling, gguf=args.gguf,
                       progress=None if args.no_progress else lambda line: print(line, file=sys.stderr, flush=True))
    print(plan.table())
    return 0

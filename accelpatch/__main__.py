"""The accelpatch command line: ``demo``, ``validate --recipe R``, ``bench --recipe R``, ``tune --recipe R --out F``,
``memory --recipe R [--budget 24GiB]``, ``recipes``, ``build-kernels``, ``doctor``, ``convert sana-video2 CKPT --out
DIR`` and ``train-tiny FAMILY`` (``python -m accelpatch COMMAND`` or ``accelpatch COMMAND``).

Parsing and ``--help`` import neither torch nor diffusers; a command's heavy modules load only when it runs.
Usage errors (also output paths that could not be written, checked before a command runs), and a ValueError or
AccelpatchError raised by a command, end in one ``accelpatch COMMAND: error:`` line with exit code 2 (argparse's own
form); Ctrl-C ends in one ``interrupted`` line with exit code 130.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from accelpatch import __version__
    from accelpatch.eval import recipe_cli
    from accelpatch.lossless.kernels.cpu_build import TYPICAL_BUILD_S  # no torch at import either
    from accelpatch.models.families import families  # each family's package registers it: no torch either
    from accelpatch.tools import build_kernels, convert, demo  # light at import: torch loads when a command runs

    parser = argparse.ArgumentParser(prog="accelpatch", description="Quality-gated fast paths for diffusers video "
                                     "pipelines: command-line tools.")
    parser.add_argument("--version", action="version", version=f"accelpatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo", help="tiny pipelines: SANA-Video tiers and MiniMax-H3 sol_attn (--model picks)",
        description="Run tiny random pipelines offline: SANA-Video unpatched and under each tier, and MiniMax-H3 "
                    f"with backend sol_attn; --model picks any of the {len(families())} families "
                    f"({', '.join(f.cli for f in families())}), a comma list, or all. Report speed with its noise, bit "
                    "identity, PSNR/SSIM, what ran and what fell back; each section prints when done, with its time.")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(check=lambda args: demo.check_args(args, demo_parser), run=demo.main)

    validate_parser = commands.add_parser(
        "validate", help="run a recipe's candidates against its reference and check the quality gates",
        description="Run the same call (same seeds) under the reference tier (twice: its noise floor) and each of "
                    "the recipe's candidates; report per-frame PSNR/SSIM, bit identity and which fast paths ran "
                    "(speed: see bench). Everything is checked before the first call. Exit codes: 0 every gate "
                    "passed, 1 a gate failed, 2 a usage or recipe error, 130 interrupted.")
    recipe_cli.add_validate_arguments(validate_parser)
    validate_parser.set_defaults(check=lambda args: recipe_cli.check_recipe_arguments(args, validate_parser),
                                 run=recipe_cli.run_validate)
    bench_parser = commands.add_parser(
        "bench", help="time a recipe's candidates per denoising step, interleaved, with a noise-aware verdict",
        description="Time each candidate (the reference first) per denoising step in interleaved rounds after a "
                    "warm-up; report median, spread and a speed-up (the median of the per-round ratios) with a "
                    "distribution-free 95% interval from order statistics (6 rounds at least), or 'not "
                    "distinguishable from noise'. Exit codes: 0 done, 2 a usage or recipe error, 130 interrupted.")
    recipe_cli.add_bench_arguments(bench_parser)
    bench_parser.set_defaults(check=lambda args: recipe_cli.check_recipe_arguments(args, bench_parser),
                              run=recipe_cli.run_bench)
    tune_parser = commands.add_parser(
        "tune", help="search a recipe's knobs for the fastest setting that passes its gates; write it as a recipe",
        description="Search the knobs of the recipe's patch (step cache, sol_attn, SANA-Video 2.0 anchors) for the "
                    "fastest setting that passes every gate on every seed (validate for quality, bench for speed), "
                    "check it on held-out seeds and write it to --out as a recipe. Exit codes: 0 a recipe written, 1 "
                    "nothing passes, 2 a usage or recipe error, 130 interrupted.")
    recipe_cli.add_tune_arguments(tune_parser)
    tune_parser.set_defaults(check=lambda args: recipe_cli.check_tune_arguments(args, tune_parser),
                             run=recipe_cli.run_tune)
    from accelpatch.memory import cli as memory  # no torch at import either
    memory_parser = commands.add_parser(
        "memory", help="plan a recipe's peak memory by stage at full size, on a CPU in seconds (no weights)",
        description="Plan the peak memory of a recipe's call by stage (text encoder, an image-to-video pipeline's "
                    "VAE encode, one transformer step unpatched and patched, VAE decode) at its full size: each model is built at its release configuration on "
                    "fake tensors (no weights downloaded, no math run) and the live tensor bytes of one call are "
                    "counted. Prints a table in GiB and, with --budget, whether the call fits. A stage whose release "
                    "configuration is not known is listed as not planned, with why. Exit codes: 0 a plan printed, "
                    "2 a usage or recipe error, 130 interrupted.")
    memory.add_arguments(memory_parser)
    memory_parser.set_defaults(check=lambda args: memory.check_args(args, memory_parser), run=memory.main)
    recipes_parser = commands.add_parser("recipes", help="list the known recipes",
                                         description="List the known recipes: $ACCELPATCH_RECIPES folders, "
                                         "./recipes, then the ones shipped with accelpatch.")
    recipes_parser.set_defaults(run=recipe_cli.run_recipes)

    kernels_parser = commands.add_parser(
        "build-kernels", help="build the fused CPU kernels now (cached per machine, torch and CPU)",
        description=f"Build the lossless tier's fused CPU kernels ahead of the first patched call (about "
                    f"{TYPICAL_BUILD_S} s on 2 cores, once per machine, torch version and CPU); a cached build only "
                    "loads. Exit code 1 with "
                    "the reason when they cannot be built (ACCELPATCH_CPU_KERNELS=0 switches them off).")
    build_kernels.add_arguments(kernels_parser)
    kernels_parser.set_defaults(run=build_kernels.main)

    doctor_parser = commands.add_parser(
        "doctor", help="print versions, CPU features, CUDA/Triton and which fast paths this environment can run",
        description="Print the versions accelpatch depends on, the CPU's features, CUDA and Triton, the fused CPU "
                    "kernels' build state, and which fast paths this environment can run (and why not). Builds "
                    "nothing.")
    doctor_parser.set_defaults(run=lambda args: __import__("accelpatch.tools.doctor", fromlist=["main"]).main(args))

    convert_parser = commands.add_parser("convert", help="convert released weights into a diffusers folder",
                                         description="Convert a model's released weights (original format) into a "
                                         "diffusers folder.")
    models = convert_parser.add_subparsers(dest="convert_model", metavar="MODEL", required=True)
    sana2_parser = models.add_parser("sana-video2", help="SANA-Video 2.0 (NVlabs/Sana .pth) to "
                                     "SanaVideo2Transformer3DModel",
                                     description="Convert a SANA-Video 2.0 checkpoint in the original NVlabs/Sana "
                                     "format into a diffusers folder that SanaVideo2Transformer3DModel.from_pretrained "
                                     "loads. Every key and shape is checked before anything is written.")
    convert.add_arguments(sana2_parser)
    sana2_parser.set_defaults(check=lambda args: convert.check_args(args, sana2_parser), run=convert.main)

    from accelpatch.tiny_models import cli as train_tiny  # no torch at import either
    train_tiny_parser = commands.add_parser(
        "train-tiny", help="train a family's tiny pipeline on procedural videos (CPU) and save it",
        description="Train a tiny version of a family's diffusers pipeline (VAE, then transformer; the text encoder "
                    "stays fixed) on seeded procedural clips whose colour and motion follow their prompt, and save "
                    "it as a folder the family's pipeline from_pretrained loads. Same seed, same weights.")
    train_tiny.add_arguments(train_tiny_parser)
    train_tiny_parser.set_defaults(check=lambda args: train_tiny.check_args(args, train_tiny_parser),
                                   run=train_tiny.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    from accelpatch.core.errors import AccelpatchError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    prog = " ".join([parser.prog, args.command, *filter(None, [getattr(args, "convert_model", None)])])
    try:
        check = getattr(args, "check", None)
        if check is not None:
            check(args)  # exits with a usage error (code 2) before anything is built
        return args.run(args)
    except (ValueError, AccelpatchError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line, as every other way a command ends; the model is left as it was
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

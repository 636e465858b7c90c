"""``accelpatch train-tiny FAMILY``: train a family's tiny pipeline on procedural clips and save it.

Declaring and checking the arguments imports no torch (``--help`` stays fast); :func:`main` loads the trainer.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from accelpatch.tiny_models import TRAINABLE_FAMILIES


def _default(name: str, value: object, shown=str) -> str:
    """``TrainingConfig``'s default of field ``name`` (``value``) and the families that set their own, for --help
    (read from the torch-free family registry, so that --help imports no trainer); ``shown`` writes a value."""
    from accelpatch.models.families import by_cli

    settings = {family: dict(by_cli(family).training.config_defaults) for family in TRAINABLE_FAMILIES}
    own = [f"{family} {shown(values[name])}" for family, values in settings.items() if name in values]
    return f"default {shown(value)}" + (f"; {', '.join(own)}" if own else "")


def _phases(phases: tuple[tuple[str, ...], ...]) -> str:
    """Motion phases as the command line gives them: ``moves then moves,grows,shrinks``."""
    return " then ".join(",".join(words) for words in phases)

def _at_least(minimum: int):
    """An argparse type: a whole number of at least ``minimum`` (steps, clips, threads)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    return parse


_positive, _count = _at_least(1), _at_least(0)


def _words(text: str) -> tuple[str, ...]:
    """``--motion-words``: comma-separated words (that a prompt can hold them is the trainer's check: the vocabulary
    lives beside torch)."""
    words = tuple(word.strip() for word in text.split(",") if word.strip())
    if not words:
        raise argparse.ArgumentTypeError(f"{text!r}: no word (e.g. moves,grows,shrinks)")
    return words


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``train-tiny``'s options (defaults: :class:`accelpatch.tiny_models.train.TrainingConfig`)."""
    parser.add_argument("family", choices=TRAINABLE_FAMILIES, help="which family's tiny pipeline to train")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="output folder, a diffusers pipeline folder (default: out/tiny-models/FAMILY; created "
                             "if needed, its files replaced)")
    parser.add_argument("--steps", type=_positive, default=None, metavar="N",
                        help=f"transformer training steps ({_default('steps', 5000)})")
    parser.add_argument("--motion-steps", type=_count, default=None, metavar="N",
                        help="steps of the motion phase after the transformer's, on the clips --motion-words names "
                             f"alone (0: none; {_default('motion_steps', 0)})")
    parser.add_argument("--motion-words", type=_words, action="append", default=None, metavar="WORD[,WORD...]",
                        help="a motion phase's clips: those whose prompt holds one of these words, comma-separated; "
                             "given again, a further phase of --motion-steps steps after it "
                             f"({_default('motion_words', (('moves',),), _phases)})")
    parser.add_argument("--vae-steps", type=_positive, default=None, metavar="N",
                        help="VAE training steps per pass (two passes: plain, then the shapes weighted; "
                             f"{_default('vae_steps', 700)}; sana-video trains no VAE: it reuses the shipped Wan's)")
    parser.add_argument("--vae-max-passes", type=_positive, default=None, metavar="N",
                        help="VAE passes at most: after the two planned ones, more run while the VAE check still "
                             f"finds a problem ({_default('vae_max_passes', 5)})")
    parser.add_argument("--videos", type=_positive, default=None, metavar="N",
                        help=f"procedural clips encoded once for the transformer phase ({_default('videos', 512)})")
    parser.add_argument("--vae-from", choices=TRAINABLE_FAMILIES, default=None, metavar="FAMILY",
                        help="reuse the shipped trained VAE of FAMILY instead of the family's own rule and train the "
                             "transformer alone (the family's own name: retrain its transformer on the VAE that ships; "
                             "default: sana-video reuses wan's, the others train their own)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models, the clips and the noise (default 0)")
    parser.add_argument("--threads", type=_positive, default=None, metavar="N",
                        help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument("--ship", action="store_true",
                        help="also write the result, in float16, into the package's shipped weights (the folder "
                             "weights/ of accelpatch.tiny_models, one subfolder per family), which "
                             "tiny_FAMILY_pipeline(trained=True) loads")


def output_dir(args: argparse.Namespace) -> Path:
    """Where the weights go: ``--out`` or ``out/tiny-models/FAMILY``."""
    return Path(args.out) if args.out is not None else Path("out") / "tiny-models" / args.family


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse, before torch loads, an output path that is a file."""
    out = output_dir(args)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: exists and is not a directory")
    parent = next((p for p in [out, *out.parents] if p.exists()), None)
    if parent is not None and not parent.is_dir():
        parser.error(f"--out {out}: {parent} is not a directory")


def vae_line(result) -> str:
    """The command's line on the run's VAE (a :class:`~accelpatch.tiny_models.train.TrainResult`): how well it holds
    whole clips, which VAE it is, and whether that is good enough."""
    check = result.vae_check
    reused = f" (the shipped {result.vae_from}'s trained VAE, reused)" if result.vae_from else ""
    return (f"train-tiny {result.family}: VAE{reused} on whole clips: MSE {check['mse']:.4f}, last/first frames' "
            f"error {check['late_over_early']:.1f}x, saturation kept {check['saturation_kept']:.0%}"
            + (f" -- NOT GOOD ENOUGH: {'; '.join(check['problems'])}" if check["problems"] else " (within limits)"))


def main(args: argparse.Namespace) -> int:
    """Train, then print how well the VAE holds whole clips (and whether that is good enough) and one line with the
    wall time and where the weights went."""
    from accelpatch.models.families import by_cli
    from accelpatch.tiny_models.train import train_family

    out = output_dir(args)
    extra = {name: value for name, value in (("vae_max_passes", args.vae_max_passes),
                                             ("motion_steps", args.motion_steps),
                                             ("motion_words", args.motion_words and tuple(args.motion_words)))
             if value is not None}
    result = train_family(args.family, out, steps=args.steps, vae_steps=args.vae_steps, videos=args.videos,
                          seed=args.seed, vae_from=args.vae_from, **extra, threads=args.threads,
                          progress=not args.no_progress)
    print(vae_line(result))
    config = result.config
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.phase_s.items())
    print(f"train-tiny {args.family}: trained in {result.wall_s:.0f} s ({phases}; VAE "
          f"{len(result.vae_losses) // config.vae_steps} passes of {config.vae_steps} steps here, transformer "
          f"{config.steps} steps on {config.videos} clips, seed {args.seed}; final transformer loss "
          f"{sum(result.transformer_losses[-50:]) / len(result.transformer_losses[-50:]):.4f}): weights in {out} "
          f"(load with {by_cli(args.family).training.pipeline}.from_pretrained)")
    if args.ship:
        from accelpatch.tiny_models.shipped import ship

        print(f"train-tiny {args.family}: shipped in float16 to {ship(out, args.family)}")
    return 0

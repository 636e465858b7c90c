"""``python -m accelpatch validate|bench|recipes``: the instruments on the command line, driven by a recipe.

``validate`` exits 0 when every candidate passes its gate, 1 when one fails, 2 on a usage or recipe error.
``bench`` exits 0 after printing its table. Everything that needs no model is checked before torch is imported or
a model built (:func:`check_outputs`, :func:`check_recipe_arguments`): the integer options by their argparse types
(``--rounds 1``, ``--warmup -2``, ``--seeds -1`` name the valid range), the recipe (an unknown name, a bad field,
``num_inference_steps: 0``), ``--space``'s knob names and the output paths, so a typo costs no run: one ``error:``
line, exit code 2. Importing this module is cheap (no torch): the work is imported when a command runs, so
``--help`` answers at once.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import Optional

#: output options -> the module writing them needs (None: nothing beyond the standard library)
_OUTPUTS = {"json": None, "plot": "matplotlib", "frames": "PIL"}


def at_least(minimum: int, why: str = ""):
    """An argparse type: an integer >= ``minimum``; anything else is argparse's usage error naming the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}{why}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def seed(text: str) -> int:
    """An argparse type: a seed, an integer from 0 to 2**64-1 (:func:`accelpatch.recipes.seed_problem`)."""
    from accelpatch.recipes import seed_problem

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer from 0 to 2**64-1, got {text!r}") from None
    problem = seed_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _rounds_option(parser: argparse.ArgumentParser) -> None:
    from accelpatch.recipes import MIN_ROUNDS

    parser.add_argument("--rounds", type=at_least(MIN_ROUNDS, " (a spread needs two samples; a verdict six)"),
                        default=None, help="timed interleaved rounds (default: the recipe's)")


def _recipe_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", required=True, metavar="R",
                        help="a recipe name (see `accelpatch recipes`) or a path to a recipe YAML file")
    parser.add_argument("--device", default=None, help="override the recipe's device (auto, cpu, cuda, cuda:N)")
    parser.add_argument("--json", metavar="OUT", default=None, help="also write the result as JSON to OUT")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    _recipe_argument(parser)
    parser.add_argument("--seeds", type=seed, nargs="+", default=None,
                        help="override the recipe's seeds (integers from 0 to 2**64-1)")
    parser.add_argument("--plot", metavar="OUT.png", default=None,
                        help="PSNR/SSIM per frame per candidate, and audio SNR/correlation per second when the "
                             "pipeline returns audio (PNG)")
    parser.add_argument("--frames", metavar="OUT.png", default=None,
                        help="worst frame of each candidate: reference | candidate | difference (PNG)")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from accelpatch.recipes import MIN_WARMUP

    _recipe_argument(parser)
    _rounds_option(parser)
    parser.add_argument("--warmup", type=at_least(MIN_WARMUP), default=None,
                        help="untimed calls per candidate (default: the recipe's)")


def output_problem(option: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be written by ``--option`` (a missing or unwritable folder, a folder in its place, the
    writer's module not installed), or None."""
    target = Path(path).expanduser()
    folder = target.parent
    if target.is_dir():
        return f"--{option} {path}: is a folder; give a file name"
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        return f"--{option} {path}: folder {str(folder)!r} {what}"
    if not os.access(folder, os.W_OK):
        return f"--{option} {path}: folder {str(folder)!r} is not writable"
    module = _OUTPUTS[option]
    if module is not None and importlib.util.find_spec(module) is None:
        package = {"PIL": "pillow"}.get(module, module)
        return f"--{option} needs {module}, which is not installed: pip install {package} (or accelpatch[plots])"
    return None


def check_outputs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse, before the run, output paths that could not be written after it: one ``error:`` line (no usage
    text: the arguments parsed), exit code 2."""
    for option in _OUTPUTS:
        path = getattr(args, option, None)
        problem = None if path is None else output_problem(option, path)
        if problem is not None:
            parser.exit(2, f"{parser.prog}: error: {problem}\n")


def _usage_error(parser: argparse.ArgumentParser, message: str) -> None:
    parser.exit(2, f"{parser.prog}: error: {' '.join(str(message).split())}\n")


def _distinct(option: str, seeds: Optional[list[int]]) -> Optional[str]:
    repeated = sorted({s for s in seeds or () if seeds.count(s) > 1})
    return f"{option}: seeds must be distinct, got {repeated} more than once" if repeated else None


def check_recipe_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """validate/bench, before torch is imported or a model built: the output paths, then the recipe (read and
    checked: an unknown name with the known ones, a bad field with what it allows, a call value out of its range),
    kept on ``args`` for the run. One ``error:`` line, exit code 2."""
    from accelpatch.recipes import RecipeError, load_recipe

    check_outputs(args, parser)
    problem = _distinct("--seeds", getattr(args, "seeds", None))
    if problem:
        _usage_error(parser, problem)
    try:
        args.loaded_recipe = load_recipe(args.recipe)
    except RecipeError as error:
        _usage_error(parser, str(error))


def _load(args: argparse.Namespace):
    """(recipe, loaded pipeline, candidates) for a command, with ``--device`` applied."""
    import torch

    from accelpatch.recipes import load_recipe
    from accelpatch.eval.pipelines import load_pipeline

    recipe = getattr(args, "loaded_recipe", None) or load_recipe(args.recipe)
    if args.device is not None:
        recipe = recipe.model_copy(update={"device": args.device})
    if recipe.is_tiny:
        torch.set_num_threads(1)  # tiny models: one thread is faster and far less noisy
    loaded = load_pipeline(recipe)
    return recipe, loaded


def run_validate(args: argparse.Namespace) -> int:
    from accelpatch.eval.validate import validate

    recipe, loaded = _load(args)
    report = validate(loaded.pipe, loaded.call_kwargs, recipe.candidate_specs(), reference=recipe.reference,
                      seeds=args.seeds or recipe.seeds, gates=recipe.gates, progress=not args.no_progress,
                      description=f"recipe {recipe.name}: {loaded.description}")
    print(report)
    if args.json:
        report.to_json(args.json)
    if args.plot:
        report.plot(args.plot)
    if args.frames:
        report.save_worst_frames(args.frames)
    return 0 if report.passed else 1


def run_bench(args: argparse.Namespace) -> int:
    from accelpatch.eval.bench import bench

    recipe, loaded = _load(args)
    candidates = [recipe.reference_spec(), *recipe.candidate_specs()]
    # without the device and dtype: the report's header says those it measured, once
    description = f"recipe {recipe.name}: {recipe.model}" + (" (random weights)" if recipe.is_random else "")
    report = bench(loaded.pipe, loaded.call_kwargs, candidates,
                   rounds=args.rounds if args.rounds is not None else recipe.bench.rounds,
                   warmup=args.warmup if args.warmup is not None else recipe.bench.warmup,
                   seed=recipe.seeds[0], progress=not args.no_progress, description=description)
    print(report)
    if args.json:
        report.to_json(args.json)
    return 0


def run_recipes(args: argparse.Namespace) -> int:
    from accelpatch.recipes import SHIPPED_RECIPES, available_recipes, load_recipe, recipe_dirs

    known = available_recipes()
    if not known:
        looked = ", ".join(map(str, recipe_dirs())) or f"./recipes, {SHIPPED_RECIPES}"
        print(f"no recipes found (looked in {looked})")
        return 0
    from accelpatch.eval._report_text import format_table

    rows = [("recipe", "model", "where", "description")]
    for name, path in known.items():
        recipe = load_recipe(path)
        rows.append((name, recipe.model, "shipped" if Path(path).parent == Path(SHIPPED_RECIPES) else str(path),
                     recipe.description))
    print(f"{len(rows) - 1} recipes (use one: --recipe NAME, or accelpatch.apply(pipe, recipe=NAME)):")
    print("\n".join(format_table(rows)))  # columns as wide as their longest cell: nothing overflows
    return 0


# --- tune (its own block: the validate/bench code above is shared with other commands) --------------------------

def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", required=True, metavar="R",
                        help="the recipe to start from (its model, call, seeds, gates and patch): a name or a YAML "
                             "path")
    parser.add_argument("--out", required=True, metavar="TUNED.yaml", help="write the winning setting as a recipe here")
    parser.add_argument("--budget", default="30m", help="time for the search: seconds or 90s, 30m, 1h (default 30m)")
    parser.add_argument("--space", default=None, metavar="YAML",
                        help="knobs to search, inline YAML/JSON: '{cache_threshold: [0.05, 0.1, 0.2]}' (default: "
                             "the knobs of the recipe's patch). Only knobs the recipe's pipeline can take: the step "
                             "cache's cache_threshold, cache_max_reuse, cache_warmup_steps, cache_final_steps (every "
                             "family); sol_attn's tau, dense_steps, dense_last_steps, min_tokens, dense_layers (not "
                             "SANA-Video, which cannot run "
                             "sol_attn); anchor_fp32_steps, anchor_fp32_layers (SANA-Video 2.0). Another is refused "
                             "with the ones it can take")
    parser.add_argument("--seeds", type=seed, nargs="+", default=None,
                        help="search seeds, integers from 0 to 2**64-1 (default: the recipe's)")
    parser.add_argument("--held-out-seeds", type=seed, nargs="+", default=None,
                        help="seeds the winner must also pass (default: one after the search seeds)")
    _rounds_option(parser)
    parser.add_argument("--device", default=None, help="override the recipe's device (auto, cpu, cuda, cuda:N)")
    parser.add_argument("--json", metavar="OUT", nargs="?", const="-", default=None,
                        help="the result as JSON: to OUT, or alone on stdout with a bare --json")
    parser.add_argument("--plot", metavar="OUT.png", default=None, help="speed against worst quality (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def check_tune_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Usage errors before torch is imported or anything built: the budget, the space (YAML, a mapping, knob names
    tune knows; which of them the model takes is checked once it is built), the seeds, every output path (as
    check_outputs) and the recipe (as :func:`check_recipe_arguments`)."""
    from accelpatch.core.errors import did_you_mean
    from accelpatch.recipes import RecipeError, load_recipe
    from accelpatch.eval.tune_space import KNOB_DIRECTIONS, parse_budget

    problems = []
    try:
        parse_budget(args.budget)
    except ValueError as error:
        problems.append(f"--budget: {error}")
    if args.space is not None:
        import yaml

        try:
            args.space = yaml.safe_load(args.space)
        except yaml.YAMLError as error:
            problems.append(f"--space is not valid YAML/JSON: {' '.join(str(error).split())}")
        else:
            if not isinstance(args.space, dict):
                problems.append(f"--space must be a mapping of knob to values, got {args.space!r}")
            else:
                unknown = [str(name) for name in args.space if name not in KNOB_DIRECTIONS]
                if unknown:
                    problems.append(f"--space: unknown knob {unknown[0]!r}{did_you_mean(unknown[0], KNOB_DIRECTIONS)}"
                                    f"; tune's knobs: {', '.join(KNOB_DIRECTIONS)} (which of them apply depends on "
                                    "the model)")
    problems += [p for p in (_distinct("--seeds", args.seeds), _distinct("--held-out-seeds", args.held_out_seeds))
                 if p]
    for option, path in (("json", None if args.json == "-" else args.json), ("plot", args.plot)):
        problem = None if path is None else output_problem(option, path)
        if problem:
            problems.append(problem)
    out = Path(args.out).expanduser()
    if out.is_dir():
        problems.append(f"--out {args.out}: is a folder; give a file name")
    elif not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        problems.append(f"--out {args.out}: folder {str(out.parent)!r} does not exist or is not writable")
    if not problems:
        try:
            args.loaded_recipe = load_recipe(args.recipe)
        except RecipeError as error:
            problems.append(str(error))
    if not problems:
        seeds = args.seeds or args.loaded_recipe.seeds
        overlap = sorted(set(seeds) & set(args.held_out_seeds or ()))
        if overlap:
            problems.append(f"--held-out-seeds must not overlap the search seeds {seeds} (a held-out check on a "
                            f"search seed checks nothing); both have {overlap}")
    if problems:
        _usage_error(parser, problems[0])


def run_tune(args: argparse.Namespace) -> int:
    """Tune from a recipe: patch the pipeline as the recipe says, search, write ``--out`` when a setting passed
    (exit 0), else exit 1 with the closest failing settings."""
    import sys
    import warnings

    import accelpatch

    from accelpatch.eval.tune import tune

    recipe, loaded = _load(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply-time notes (a fast path that cannot run here) are in the report
        accelpatch.apply(loaded.pipe, **recipe.apply_arguments())
    result = tune(loaded.pipe, loaded.call_kwargs, gates=recipe.gates, seeds=args.seeds or recipe.seeds,
                  held_out_seeds=args.held_out_seeds, budget=args.budget, space=args.space,
                  reference=recipe.reference, rounds=args.rounds if args.rounds is not None else recipe.bench.rounds,
                  warmup=recipe.bench.warmup, progress=not args.no_progress,
                  description=f"recipe {recipe.name}: {loaded.description}")
    if args.json == "-":
        print(result.to_json())
    else:
        print(result)
        if args.json:
            result.to_json(args.json)
    if args.plot:
        result.plot(args.plot)
    if not result.passed:
        return 1
    result.save_recipe(args.out, template=recipe)
    print(f"wrote {args.out}", file=sys.stderr if args.json == "-" else sys.stdout)
    return 0

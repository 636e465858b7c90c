"""Plan every shipped full-size recipe at its own size (issue #44): the per-stage figures and what fits 16, 24, 48 and
80 GiB, as the tables of docs/memory.md show them. Memory, not speed: fake tensors, no weights, no math.

    python benchmarks/memory_full_size.py [--recipes R1,R2] [--tier lossless]
"""
from __future__ import annotations

import argparse
import time

from accelpatch.memory.plan import memory_plan
from accelpatch.memory.sizes import gib
from accelpatch.recipes import available_recipes, load_recipe

BUDGETS = (16, 24, 48, 80)
#: sizes for recipes whose call leaves them to the input image (HunyuanVideo 1.5 I2V: its 480p bucket for 16:9)
GIVEN = {"hunyuan-video15-step-distilled": dict(height=480, width=848)}


def _fits(plan, **how) -> str:
    return ", ".join(str(b) for b in BUDGETS if plan.fits(f"{b}GiB", **how) is not False) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", help="comma-separated recipe names (default: every full-size recipe)")
    parser.add_argument("--tier", help="plan the patched step at this tier instead of the recipe's")
    args = parser.parse_args()
    names = args.recipes.split(",") if args.recipes else [n for n in available_recipes()
                                                           if not load_recipe(n).is_tiny]
    print("| recipe | call | text encoder | transformer weights | activations unpatched / patched | VAE decode | "
          "all on the device, unpatched / patched | one at a time | fits all on / one at a time | planned in |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        start = time.perf_counter()
        try:
            plan = memory_plan(name, tier=args.tier, **GIVEN.get(name, {}))
        except ValueError as error:
            print(f"| {name} | not planned: {error} |")
            continue
        seconds = time.perf_counter() - start
        named = {stage.name: stage for stage in plan.stages}
        step = next(s for s in plan.stages if s.name.startswith("transformer step"))
        text, vae, audio = named["text encoder"], named["VAE decode"], named.get("audio decode")
        between = plan.stages[1:plan.stages.index(step)]  # what runs on the text (LTX-2's connectors)
        cell = (lambda s: f"{gib(s.weights)} + {gib(s.activations)}" if s.planned else "not planned")
        text_cell = "; ".join([cell(text), *(f"{s.name} {cell(s)}" for s in between)])
        vae_cell = cell(vae) + (f"; audio {cell(audio)}" if audio is not None else "")
        h, w, f = plan.size
        peaks = [plan.peak(patched=p, offload=o) for o in (False, True) for p in (False, True)]
        shown = [("" if complete else "≥ ") + gib(v) for v, complete in peaks]
        print(f"| {name} | {h}×{w}×{f}{' (given)' if name in GIVEN else ''} | {text_cell} | "
              f"{gib(step.weights) if step.planned else 'not planned'} | "
              f"{gib(step.activations) if step.planned else '-'} / "
              f"{gib(plan.patched.activations) if plan.patched else '-'} | {vae_cell} | {shown[0]} / {shown[1]} | "
              f"{shown[3]} | {_fits(plan)} / {_fits(plan, offload=True)} | {seconds:.0f} s |", flush=True)


if __name__ == "__main__":
    main()

"""accelpatch.tune searches Sol-Attn's step knobs (#42, part 3): ``dense_steps`` as fractions of the recipe's steps,
``dense_last_steps`` (a dense tail), the ``min_tokens`` floor where it keeps some calls dense; duplicates by step
count collapse, the safest passing setting is kept, and the tuned recipe keeps a fraction a fraction.

Quality verdicts are scripted (TuneSetup.validate replaced) and speed is the fake timer of tests/test_tune.py, so no
heavy model run; the tiny MiniMax-H3 runs only the floor probe. Expected grids are written out by hand. Nothing here
reads SolAttnConfig's current defaults except through its dataclass fields (they are about to change).
"""
import dataclasses
import warnings

import pytest
import torch

import accelpatch
from accelpatch import testing
from accelpatch.eval.tune_oracle import REFERENCE_NAME
from accelpatch.eval.tune_space import (FLOOR_ALL, FLOOR_NONE, FLOOR_SOME, MIN_TOKENS_FLOOR, derive_space,
                                        measure_floor_effect, parse_space)
from accelpatch.sol_attn.config import SolAttnConfig

ROUNDS = 7


def default(name):
    return next(f.default for f in dataclasses.fields(SolAttnConfig) if f.name == name)


#: the floor tune offers: SolAttnConfig's default, or MIN_TOKENS_FLOOR where that is 0
FLOOR = default("min_tokens") or MIN_TOKENS_FLOOR


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def h3():
    torch.set_num_threads(1)
    pipe = testing.tiny_minimax_h3_pipeline()
    kwargs = testing.minimax_h3_pipeline_call_kwargs(num_inference_steps=4, pipeline=pipe, height=64, width=32)
    kwargs.pop("generator")
    kwargs["output"] = "videos"
    yield pipe, kwargs
    accelpatch.remove(pipe)


def patched(pipe, **options):
    accelpatch.remove(pipe)
    quiet(accelpatch.apply, pipe, backend="sol_attn", dense_layers="", **options)


def grid(space):
    return {k.name: k.values for k in space.knobs}


def test_the_grid_of_a_4_and_a_50_step_recipe(h3):
    pipe, _ = h3
    some = lambda floor: FLOOR_SOME  # noqa: E731 - the floor keeps some calls dense (what the probe would say)
    patched(pipe, tau=1.0, dense_steps=0.2, dense_last_steps=0, min_tokens=0)
    # 4 steps: 0.3 -> ceil(1.2) = 2, 0.2 -> ceil(0.8) = 1, 0.1 -> ceil(0.4) = 1 (the same as 0.2: dropped), 0
    four = derive_space(pipe, {"num_inference_steps": 4}, floor_effect=some)
    assert grid(four) == {"tau": (0.0, 0.5, 1.0, 2.0, 4.0), "dense_steps": (0.3, 0.2, 0),
                          "dense_last_steps": (1, 0), "min_tokens": (FLOOR, 0)}
    # 50 steps: 15, 10, 5, 0 steps
    fifty = derive_space(pipe, {"num_inference_steps": 50}, floor_effect=some)
    assert grid(fifty) == {"tau": (0.0, 0.5, 1.0, 2.0, 4.0), "dense_steps": (0.3, 0.2, 0.1, 0),
                           "dense_last_steps": (1, 0), "min_tokens": (FLOOR, 0)}
    assert fifty.size() == 5 * 4 * 2 * 2 <= 1350
    # the user's own values stay in their form and keep their count: a count 10 of 50 is 0.2's, a tail of 0.1 of 50
    # is 5 steps (safer than 1), of 4 steps 1 (the same as 1: the user's 0.1 stays)
    patched(pipe, tau=1.5, dense_steps=10, dense_last_steps=0.1, min_tokens=0)
    fifty = derive_space(pipe, {"num_inference_steps": 50}, floor_effect=some)
    assert grid(fifty)["tau"] == (0.0, 0.5, 1.0, 1.5, 2.0, 4.0)
    assert grid(fifty)["dense_steps"] == (0.3, 10, 0.1, 0)
    assert grid(fifty)["dense_last_steps"] == (0.1, 1, 0)
    four = derive_space(pipe, {"num_inference_steps": 4}, floor_effect=some)
    assert grid(four)["dense_steps"] == (10, 0.3, 0.2, 0)  # 10 of 4 is every step: the safest
    assert grid(four)["dense_last_steps"] == (0.1, 0)
    # of two fractions that give the same count, the larger (safer at other step counts) stays: at 4 steps 0.2 and
    # 0.1 are both 1 step, and 0.2 is kept
    patched(pipe, dense_steps=0.3, dense_last_steps=0, min_tokens=0)
    assert grid(derive_space(pipe, {"num_inference_steps": 4}, floor_effect=some))["dense_steps"] == (0.3, 0.2, 0)


def test_duplicates_collapse_in_a_users_space_too(h3):
    pipe, _ = h3
    patched(pipe, dense_steps=0.2, min_tokens=0)
    # at 4 steps 0.2, 0.1 and 1 are all 1 step: the first given stays; "50%" is 2 steps, written 0.5
    space = parse_space(pipe, {"dense_steps": [0.2, 0.1, 1, "50%", 0]}, {"num_inference_steps": 4})
    assert grid(space) == {"dense_steps": (0.5, 0.2, 0)}
    # at 50 steps they differ, and are ordered by the steps they keep (0.2 = 10 steps is safer than 5)
    space = parse_space(pipe, {"dense_steps": [5, 0.2, 0], "dense_last_steps": [0, 1, 0.1]},
                        {"num_inference_steps": 50})
    assert grid(space) == {"dense_steps": (0.2, 5, 0), "dense_last_steps": (0.1, 1, 0)}


def test_the_floor_is_searched_only_where_it_keeps_some_calls_dense(h3):
    pipe, kwargs = h3
    patched(pipe, dense_steps=0.2, min_tokens=0)
    for effect in (FLOOR_NONE, FLOOR_ALL, None):  # no-op, all-dense, unknown: no candidate of its own
        space = derive_space(pipe, kwargs, floor_effect=lambda floor, e=effect: e)
        assert "min_tokens" not in grid(space) and space.options.get("min_tokens", 0) == 0
    # a floor of the user's that keeps every call dense would make every other knob moot: it is searched at 0
    patched(pipe, dense_steps=0.2, min_tokens=FLOOR + 1)
    space = derive_space(pipe, kwargs, floor_effect=lambda floor: FLOOR_ALL)
    assert "min_tokens" not in grid(space) and space.options["min_tokens"] == 0
    # one that keeps some calls dense is searched, with the default floor, highest first
    space = derive_space(pipe, kwargs, floor_effect=lambda floor: FLOOR_SOME)
    assert grid(space)["min_tokens"] == (FLOOR + 1, FLOOR, 0)
    # the probe, on the tiny model (a few hundred tokens per call): a floor of 1 keeps nothing dense, the default
    # floor everything
    from accelpatch.core.patcher import patch_of

    patched(pipe, dense_steps=0.2, min_tokens=0)
    before = patch_of(pipe.transformer).requested
    effect = measure_floor_effect(pipe, kwargs, {})
    assert (effect(1), effect(FLOOR)) == (FLOOR_NONE, FLOOR_ALL)
    assert patch_of(pipe.transformer).requested == before  # the probe put the patch back


class Timer:
    """Seconds per round: the reference 1 s with a drift shared by the round, a setting 1 / speed with +-0.5 %
    jitter; speed grows with each knob's index (looser is faster), so settings of different speed are told apart."""

    def __init__(self, space):
        self.space = space

    def speed(self, options):
        return 1.0 + sum((1.0 + k) * knob.values.index(options[knob.name]) / len(knob.values)
                         for k, knob in enumerate(self.space.knobs))

    def __call__(self, specs):
        drift = [1.0 + 0.04 * ((3 * i) % 5) for i in range(ROUNDS)]
        jitter = [1.0 + 0.005 * (-1) ** i for i in range(ROUNDS)]
        return {REFERENCE_NAME: drift, **{s.name: [d * j / self.speed(s.options) for d, j in zip(drift, jitter)]
                                          for s in specs}}


class Noise(Timer):
    """Every setting is noise against the reference: nothing is measurably faster."""

    def __call__(self, specs):
        ratios = [0.77, 0.95, 1.0, 1.03, 1.1, 1.2, 1.56]
        return {REFERENCE_NAME: [1.0] * ROUNDS, **{s.name: [1 / r for r in ratios] for s in specs}}


def scripted_validate(monkeypatch, rule):
    """Replace validate: a candidate passes when ``rule(options)``; no pipeline call."""
    from types import SimpleNamespace

    from accelpatch.eval.tune_oracle import TuneSetup

    def validate(self, specs, seeds):
        return SimpleNamespace(candidates=[
            SimpleNamespace(spec=s, passed=rule(s.options), reasons=[] if rule(s.options) else ["scripted"],
                            min_ssim=0.99 if rule(s.options) else 0.5, min_psnr=40.0) for s in specs])

    monkeypatch.setattr(TuneSetup, "validate", validate)


def steps_of(value, total=4):
    from accelpatch.core.steps import step_count

    return step_count(value).of(total)


def test_tune_keeps_the_safest_passing_setting_and_writes_fractions_as_fractions(h3, monkeypatch, tmp_path,
                                                                                   capsys):
    pipe, kwargs = h3
    patched(pipe, tau=1.0, dense_steps=0.3, dense_last_steps=0, min_tokens=0)
    monkeypatch.setattr("accelpatch.eval.tune_space.measure_floor_effect", lambda *a: lambda floor: FLOOR_SOME)
    space = derive_space(pipe, kwargs, floor_effect=lambda floor: FLOOR_SOME)
    assert [k.name for k in space.knobs] == ["tau", "dense_steps", "dense_last_steps", "min_tokens"]
    # passes with at least one dense step of 4 and tau at most 1, whatever the tail and the floor
    rule = lambda o: steps_of(o["dense_steps"]) >= 1 and o["tau"] <= 1.0  # noqa: E731
    scripted_validate(monkeypatch, rule)
    result = quiet(accelpatch.tune, pipe, kwargs, progress=True, _timer=Timer(space))
    err = capsys.readouterr().err
    assert ("accelpatch tune: searching tau [0.0, 0.5, 1.0, 2.0, 4.0]; dense_steps [0.3 (2 of 4 steps), "
            f"0.2 (1 of 4 steps), 0]; dense_last_steps [1, 0]; min_tokens [{FLOOR}, 0] (safe → fast; 60 grid "
            "points)") in err
    passing = result.passing
    assert len(passing) > 1 and all(rule(t.spec.options) for t in passing)
    # several pass and the looser ones are measurably faster: the fastest, the loosest passing corner
    assert result.faster and result.winner.setting == {"tau": 1.0, "dense_steps": 0.2, "dense_last_steps": 0,
                                                       "min_tokens": 0}
    path = tmp_path / "tuned.yaml"
    result.save_recipe(str(path), model="tiny:minimax-h3")
    recipe = accelpatch.recipes.load_recipe(str(path))
    assert recipe.options["dense_steps"] == 0.2 and isinstance(recipe.options["dense_steps"], float)
    assert recipe.options["dense_last_steps"] == 0 and recipe.options["min_tokens"] == 0
    assert "dense_steps: 0.2\n" in path.read_text()
    assert recipe.measured["by"] == "accelpatch tune"
    # nothing measurably faster: the safest passing setting is kept (here the safe point: every knob at index 0)
    result = quiet(accelpatch.tune, pipe, kwargs, progress=False, _timer=Noise(space))
    assert not result.faster and result.winner.setting == {"tau": 0.0, "dense_steps": 0.3, "dense_last_steps": 1,
                                                           "min_tokens": FLOOR}
    path = tmp_path / "kept.yaml"
    result.save_recipe(str(path), model="tiny:minimax-h3")
    recipe = accelpatch.recipes.load_recipe(str(path))
    assert recipe.options["dense_steps"] == 0.3 and recipe.options["dense_last_steps"] == 1
    assert recipe.options["min_tokens"] == FLOOR and "speedup" not in recipe.measured


def test_the_safest_of_several_passing_settings_is_kept_by_the_knobs_order(h3):
    """When the safe point is not among the passing (held-out fail, or not tried), the kept setting is the one
    nearest the safe end: more dense steps, a dense tail, a higher floor, a lower tau."""
    from types import SimpleNamespace

    from accelpatch.eval.tune import _held_out_winner
    from accelpatch.eval.tune_result import Trial

    pipe, _ = h3
    patched(pipe, tau=1.0, dense_steps=0.2, dense_last_steps=0, min_tokens=0)
    space = derive_space(pipe, {"num_inference_steps": 50}, floor_effect=lambda floor: FLOOR_SOME)
    # knobs: tau (0, 0.5, 1, 2, 4), dense_steps (0.3, 0.2, 0.1, 0), dense_last_steps (1, 0), min_tokens (F, 0)
    points = [(0, 0, 0, 0),  # the safe point: fails on the held-out seeds below
              (2, 1, 0, 0),  # tau 1, 0.2, tail, floor: 3 steps from the safe end
              (0, 1, 1, 1),  # tau 0, 0.2, no tail, no floor: 3 steps too, after it in grid order
              (0, 2, 0, 0),  # tau 0, 0.1, tail, floor: 2 steps: the safest passing one
              (4, 3, 1, 1)]  # the loosest
    trials = [Trial(point=p, setting=space.setting(p), spec=space.spec(p).model_copy(update={"name": str(p)}),
                    passed=True, faster=False) for p in points]

    class Setup:
        seeds = [0]

        def validate(self, specs, seeds):
            ok = specs[0].name != str((0, 0, 0, 0))
            return SimpleNamespace(candidates=[SimpleNamespace(passed=ok, min_ssim=0.99, min_psnr=40.0,
                                                               reasons=[] if ok else ["held out"])])

    bar = SimpleNamespace(set_postfix_str=lambda text: None)
    notes = []
    winner = _held_out_winner(Setup(), trials, [1], notes, bar)
    assert winner.point == (0, 2, 0, 0)
    assert winner.setting == {"tau": 0.0, "dense_steps": 0.1, "dense_last_steps": 1, "min_tokens": FLOOR}
    assert any("kept the safest passing setting" in n for n in notes)

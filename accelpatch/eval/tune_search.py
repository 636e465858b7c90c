"""The search behind ``accelpatch.tune``, on grid indices only: which points to validate, in which batches.

A point is one index per knob; index 0 is each knob's safest value, higher indices are faster and worse (the
directions are in :mod:`accelpatch.eval.tune_space`). The search assumes that order (monotone knobs) and uses it
twice: a point at or beyond a failing point in every knob is taken to fail without running it, and the loosest
passing value of a knob is found by bisection, not by walking the grid. It never calls a point it did not
validate "passing"; inferred failures are simply not run.

1. **Frontiers** (one validate call per bisection level, all knobs together): the safe point, then for each knob
   alone (the others safe) its loosest value first, then bisection between the last pass and the first fail.
2. **Order**: the frontier point of each knob is timed; knobs are taken by the speed-up they gave alone.
3. **Combination**: the corner (every knob at its frontier) is validated; if it fails, greedy: the fastest knob at
   its frontier, then each next knob bisected between safe and its frontier with the earlier ones fixed. With time
   left, again starting from the second-fastest knob, and so on. Each pass ends at a point where no single knob
   can loosen.

4. **Explore** (``explore=True``, until the budget ends): the points not run, fastest first by an additive model
   of the speeds timed in step 2, without inferring failures: knobs of a real model are not always monotone.

Everything is asked through an :class:`Oracle` (validate for quality, bench for speed), so the same code runs
against a pipeline or a synthetic problem (tests, the benchmark). The budget is the oracle's: it answers only the
points it had time for (a prefix of a batch, so it can stop inside a level), and the search then stops, recording
the stage it was in and the points of that batch it did not run (:attr:`SearchLog.stopped_in`,
:attr:`SearchLog.skipped`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

__all__ = ["Oracle", "SearchLog", "search", "search_grid", "all_points", "unexplored", "STAGES"]

Point = tuple[int, ...]

#: the search's stages, in order (what a budget stop names as reached or not)
FRONTIERS = "finding each knob's limit alone"
ORDERING = "timing the knobs alone to order them"
COMBINING = "combining the knobs"
EXPLORING = "exploring untried settings (explore=True)"
STAGES = (FRONTIERS, ORDERING, COMBINING, EXPLORING)


class Oracle(Protocol):
    def passes(self, points: list[Point]) -> dict[Point, bool]:
        """Validate ``points`` in order and say which pass every gate on every seed; the answer holds only the
        points it validated: a prefix, shorter when the budget ended inside the batch."""

    def speed(self, points: list[Point]) -> dict[Point, float]:
        """Speed-up over the reference of each point (higher is faster); empty when the budget has no room."""


@dataclass
class SearchLog:
    """What the search ran: every validated point with its verdict (in the order run), the per-knob frontiers,
    the speeds it measured to order the knobs, and whether the budget cut it short."""

    results: dict[Point, bool] = field(default_factory=dict)
    frontier: list[int] = field(default_factory=list)
    speeds: dict[Point, float] = field(default_factory=dict)
    batches: int = 0
    stopped_by_budget: bool = False
    maximal: list[Point] = field(default_factory=list)
    #: where the budget stopped it: the stage (one of STAGES) and the points asked for but not run
    stopped_in: Optional[str] = None
    skipped: list[Point] = field(default_factory=list)
    stage: str = FRONTIERS

    def stop(self, skipped: Sequence[Point] = ()) -> None:
        """Record a budget stop in the current stage, with the points it did not run."""
        self.stopped_by_budget, self.stopped_in, self.skipped = True, self.stage, list(skipped)

    @property
    def passing(self) -> list[Point]:
        return [p for p, ok in self.results.items() if ok]


class _Runner:
    """Asks the oracle for the points not known yet, never twice, and infers failures from failing points."""

    def __init__(self, oracle: Oracle, log: SearchLog) -> None:
        self.oracle, self.log = oracle, log

    def inferred_fail(self, point: Point) -> bool:
        return any(not ok and all(a >= b for a, b in zip(point, known)) for known, ok in self.log.results.items())

    def known(self, point: Point) -> Optional[bool]:
        if point in self.log.results:
            return self.log.results[point]
        return False if self.inferred_fail(point) else None

    def run(self, points: Sequence[Point]) -> Optional[dict[Point, bool]]:
        """Verdicts of ``points`` (known ones without a call); None when the budget stopped the batch (what it
        validated before is kept)."""
        todo = list(dict.fromkeys(p for p in points if self.known(p) is None))
        if todo:
            verdicts = self.oracle.passes(todo)
            self.log.batches += bool(verdicts)
            for p in todo:
                if p in verdicts:
                    self.log.results[p] = bool(verdicts[p])
            missing = [p for p in todo if p not in verdicts]
            if missing:
                self.log.stop(missing)
                return None
        return {p: bool(self.known(p)) for p in points}


@dataclass
class _Line:
    """Bisection along one knob: ``lo`` is known to pass, ``hi`` known (or inferred) to fail, ``None`` unknown."""

    knob: int
    base: Point
    lo: int
    top: int
    hi: Optional[int] = None

    def point(self, index: int) -> Point:
        p = list(self.base)
        p[self.knob] = index
        return tuple(p)

    @property
    def done(self) -> bool:
        return self.lo == self.top or (self.hi is not None and self.hi - self.lo <= 1)

    def probe(self) -> int:
        return self.top if self.hi is None else (self.lo + self.hi) // 2

    def update(self, index: int, passed: bool) -> None:
        if passed:
            self.lo = index
        else:
            self.hi = index


def _bisect(lines: list[_Line], runner: _Runner) -> bool:
    """Run the lines' bisections side by side, one batch per level; False when the budget stopped them."""
    while True:
        open_lines = [line for line in lines if not line.done]
        if not open_lines:
            return True
        probes = [(line, line.probe()) for line in open_lines]
        verdicts = runner.run([line.point(i) for line, i in probes])
        if verdicts is None:
            return False
        for line, i in probes:
            line.update(i, verdicts[line.point(i)])


def search(sizes: Sequence[int], oracle: Oracle, *, orders: Optional[int] = None, explore: bool = False) -> SearchLog:
    """:func:`_structured` (see the module docstring), then with ``explore`` the points it did not run, fastest
    predicted first, until the budget ends (:func:`_explore`)."""
    log = _structured(sizes, oracle, orders=orders)
    if explore and not log.stopped_by_budget and log.results and next(iter(log.results.values())):
        _explore(tuple(int(n) for n in sizes), oracle, log)
    return log


def _predicted_speed(sizes: Point, log: SearchLog) -> "Callable[[Point], float]":
    """An additive model of speed from what was timed: each knob's speed-up at its frontier, linear in the index
    (a knob never timed gets the mean slope of the others; a slope measured at or below zero is taken as noise and
    kept just above it, so looser points still come first)."""
    slopes: dict[int, float] = {}
    for point, speed in log.speeds.items():
        moved = [k for k, i in enumerate(point) if i]
        if len(moved) == 1:
            slopes[moved[0]] = (speed - 1.0) / point[moved[0]]
    slopes = {k: max(v, 1e-3) for k, v in slopes.items()}  # looser is faster by the knobs' order: below is noise
    default = sum(slopes.values()) / len(slopes) if slopes else 1.0
    per_knob = [slopes.get(k, default) for k in range(len(sizes))]
    return lambda p: 1.0 + sum(a * i for a, i in zip(per_knob, p))


def _explore(sizes: Point, oracle: Oracle, log: SearchLog) -> None:
    """Validate the points not run yet that the model predicts faster than the fastest passing one, fastest
    first, one batch of ``len(sizes) + 1`` at a time, without inferring failures: where the knobs are not monotone
    (a cache reusing other steps when a guard moves), this finds what bisection stepped over."""
    predict = _predicted_speed(sizes, log)
    best = max((predict(p) for p in log.passing), default=1.0)
    todo = sorted((p for p in all_points(sizes) if p not in log.results and predict(p) > best),
                  key=lambda p: (-predict(p), p))
    batch = len(sizes) + 1
    log.stage = EXPLORING
    while todo:
        chunk, todo = todo[:batch], todo[batch:]
        verdicts = oracle.passes(chunk)
        log.batches += bool(verdicts)
        log.results.update({p: bool(ok) for p, ok in verdicts.items()})
        if len(verdicts) < len(chunk):
            log.stop([p for p in chunk if p not in verdicts] + todo)
            return
        passed = [p for p in chunk if verdicts[p]]
        if passed:
            best = max(best, max(predict(p) for p in passed))
            todo = [p for p in todo if predict(p) > best]
            log.maximal.extend(p for p in passed if p not in log.maximal)


def _structured(sizes: Sequence[int], oracle: Oracle, *, orders: Optional[int] = None) -> SearchLog:
    """Search the grid of ``sizes`` (values per knob) for fast passing points; see the module docstring.
    ``orders``: how many greedy passes (starting knobs) to try when the corner fails; None: one per knob (on
    random monotone problems, 1 pass found a point within 5 % of the grid's fastest in 92 % of them, 3 in 98 %,
    all 5 in 99 %: benchmarks/bench_tune.py)."""
    sizes = tuple(int(n) for n in sizes)
    log = SearchLog(frontier=[0] * len(sizes))
    runner = _Runner(oracle, log)
    safe: Point = (0,) * len(sizes)
    lines = [_Line(knob=k, base=safe, lo=0, top=n - 1) for k, n in enumerate(sizes) if n > 1]
    first = runner.run([safe] + [line.point(line.top) for line in lines])  # the safe point and every loose end
    if first is None or not first[safe]:
        return log  # the safest setting fails: by the order, so does every other
    for line in lines:
        line.update(line.top, first[line.point(line.top)])
    finished = _bisect(lines, runner)
    for line in lines:
        log.frontier[line.knob] = line.lo
    if not finished:
        return log
    moving = [k for k, f in enumerate(log.frontier) if f > 0]
    if not moving:
        log.maximal.append(safe)
        return log
    alone = {k: tuple(log.frontier[k] if i == k else 0 for i in range(len(sizes))) for k in moving}
    if len(moving) == 1:
        log.maximal.append(alone[moving[0]])
        return log
    log.stage = ORDERING
    speeds = oracle.speed(list(alone.values()))
    if len(speeds) < len(alone):
        log.stop()
        return log
    log.speeds.update(speeds)
    log.stage = COMBINING
    order = sorted(moving, key=lambda k: -log.speeds.get(alone[k], 0.0))
    corner = tuple(log.frontier)
    verdict = runner.run([corner])
    if verdict is None:
        return log
    if verdict[corner]:
        log.maximal.append(corner)
        return log
    for start in range(len(order) if orders is None else min(orders, len(order))):
        sequence = order[start:start + 1] + order[:start] + order[start + 1:]
        point = alone[sequence[0]]
        for k in sequence[1:]:
            line = _Line(knob=k, base=point, lo=0, top=log.frontier[k])
            if not _bisect([line], runner):
                return log
            point = line.point(line.lo)
        if point not in log.maximal:
            log.maximal.append(point)
    return log


def all_points(sizes: Sequence[int]) -> list[Point]:
    """Every point of the grid, safest first (row-major)."""
    import itertools

    return [tuple(p) for p in itertools.product(*(range(n) for n in sizes))]


def search_grid(sizes: Sequence[int], oracle: Oracle, *, batch: int = 16) -> SearchLog:
    """The exhaustive baseline: validate every grid point (``batch`` per call), no inference."""
    log = SearchLog(frontier=[0] * len(sizes))
    points = all_points(sizes)
    for start in range(0, len(points), batch):
        chunk = points[start:start + batch]
        verdicts = oracle.passes(chunk)
        log.batches += bool(verdicts)
        log.results.update({p: bool(ok) for p, ok in verdicts.items()})
        if len(verdicts) < len(chunk):
            log.stop(points[start + len(verdicts):])
            break
    return log


def unexplored(sizes: Sequence[int], log: SearchLog) -> list[Point]:
    """The grid points neither validated nor ruled out (at or beyond a failing point in every knob): what a
    budget stop left open."""
    runner = _Runner(None, log)  # type: ignore[arg-type]  (inference only: no oracle call)
    return [p for p in all_points(sizes) if runner.known(p) is None]

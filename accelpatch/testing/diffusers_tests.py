"""Run diffusers' own model tests for every family that names its test file (``Family.diffusers_tests``: Wan, Wan
VACE, Wan Animate, HunyuanVideo 1.5, LTX-2) twice, unpatched and with every model patched by accelpatch at the
default tier (the pytest plugin :mod:`accelpatch.testing.diffusers_tests_plugin`), and show
both outcomes side by side.

    python -m accelpatch.testing.diffusers_tests --diffusers-tests ~/src/diffusers [--models wan,ltx2] [-- -x -k train]

``--diffusers-tests`` is a diffusers git checkout (its root: the folder holding ``tests/``) at the installed
diffusers version; pip's diffusers ships no tests. Arguments after ``--`` go to both pytest runs. The exit code is
1 when the patched run has a failure the unpatched run does not (or the plugin patched nothing), 2 on bad
arguments, else 0.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional, Sequence

from accelpatch.models.families import families

#: ``--models`` names -> diffusers' test file for that model, relative to the checkout's root (each registered family
#: that names one: accelpatch.models.families)
TEST_FILES = {family.key: family.diffusers_tests for family in families() if family.diffusers_tests}
PLUGIN = "accelpatch.testing.diffusers_tests_plugin"
OUTCOMES = ("passed", "failed", "skipped")


class UsageError(ValueError):
    """Bad arguments: the message says what was expected."""


def parse_models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TEST_FILES]
    if unknown or not names:
        raise UsageError(f"--models: unknown model name(s) {unknown or text!r}; valid: {', '.join(TEST_FILES)} "
                         "(comma-separated)")
    return names


def test_files(checkout: Path, models: Sequence[str]) -> list[Path]:
    """The test files of ``models`` in ``checkout``, or a UsageError naming what is missing."""
    if not checkout.is_dir():
        raise UsageError(f"--diffusers-tests {checkout}: no such directory (expected a diffusers git checkout, the "
                         "folder holding tests/models/transformers/)")
    if not (checkout / "tests" / "models" / "transformers").is_dir():
        hint = (" (this looks like its tests/ folder: pass the folder above it)"
                if (checkout / "models" / "transformers").is_dir() else "")
        raise UsageError(f"--diffusers-tests {checkout} is not a diffusers checkout: expected "
                         f"{checkout / 'tests' / 'models' / 'transformers'}{hint}")
    files = [checkout / TEST_FILES[m] for m in models]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise UsageError(f"--diffusers-tests {checkout}: missing test file(s) {', '.join(missing)} (a diffusers "
                         "checkout at the installed diffusers version has them)")
    return files


def run_pytest(checkout: Path, files: Sequence[Path], extra: Sequence[str], *, patched: bool,
               workdir: Path) -> tuple[int, dict[str, str], Optional[dict], str]:
    """One pytest run in a subprocess: (exit code, test id -> outcome, the plugin's summary or None, output)."""
    tag = "patched" if patched else "unpatched"
    junit = workdir / f"{tag}.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
               *[str(f.relative_to(checkout)) for f in files]]
    summary_path = workdir / f"{tag}-summary.json"
    if patched:
        command[3:3] = ["-p", PLUGIN, f"--accelpatch-summary-json={summary_path}"]
    command += list(extra)
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # where accelpatch is importable from
    env["PYTHONPATH"] = os.pathsep.join([package_root, env["PYTHONPATH"]] if env.get("PYTHONPATH") else
                                        [package_root])
    print(f"[{tag}] {' '.join(command)}", flush=True)
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    outcomes = parse_junit(junit) if junit.exists() else {}
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return done.returncode, outcomes, summary, done.stdout + done.stderr


def parse_junit(path: Path) -> dict[str, str]:
    """test id (``module.Class::name``) -> passed / failed / skipped, from a junit XML report (errors count as
    failed)."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        if outcomes.get(test_id) == "failed":  # a teardown error adds a second entry: failed wins
            continue
        outcomes[test_id] = outcome
    return outcomes


def file_of(test_id: str, files: Sequence[Path]) -> str:
    for f in files:
        if f".{f.stem}." in f".{test_id.partition('::')[0]}.":
            return f.name
    return "(other)"


def compare(files: Sequence[Path], unpatched: dict[str, str], patched: dict[str, str]) -> tuple[list[str], list[str]]:
    """(report lines, ids that fail only when patched)."""
    lines = [f"{'file':<44} {'unpatched (passed/failed/skipped)':>34} {'patched':>18}"]
    for f in files:
        row = []
        for outcomes in (unpatched, patched):
            counts = collections.Counter(o for t, o in outcomes.items() if file_of(t, files) == f.name)
            row.append("/".join(str(counts[o]) for o in OUTCOMES))
        lines.append(f"{f.name:<44} {row[0]:>34} {row[1]:>18}")
    differ = sorted(t for t in set(unpatched) | set(patched) if unpatched.get(t) != patched.get(t))
    if differ:
        lines.append("tests whose outcome differs (unpatched -> patched):")
        lines.extend(f"  {t}: {unpatched.get(t, 'absent')} -> {patched.get(t, 'absent')}" for t in differ)
    regressions = [t for t in differ if patched.get(t) == "failed"]
    return lines, regressions


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m accelpatch.testing.diffusers_tests",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--diffusers-tests", required=True, type=Path, metavar="PATH",
                        help="a diffusers git checkout (the folder holding tests/) at the installed version")
    parser.add_argument("--models", default=",".join(TEST_FILES),
                        help=f"comma-separated, from {', '.join(TEST_FILES)} (default: all)")
    parser.add_argument("--list", action="store_true", help="print every test id with both outcomes")
    args = parser.parse_args(argv)
    try:
        models = parse_models(args.models)
        files = test_files(args.diffusers_tests.expanduser().resolve(), models)
    except UsageError as error:
        parser.exit(2, f"error: {error}\n")
    checkout = args.diffusers_tests.expanduser().resolve()
    with tempfile.TemporaryDirectory(prefix="accelpatch-dtests-") as tmp:
        code_u, unpatched, _, out_u = run_pytest(checkout, files, extra, patched=False, workdir=Path(tmp))
        code_p, patched, summary, out_p = run_pytest(checkout, files, extra, patched=True, workdir=Path(tmp))
    for tag, code, out, outcomes in (("unpatched", code_u, out_u, unpatched), ("patched", code_p, out_p, patched)):
        if not outcomes:  # nothing ran: show why (a collection error, a bad pytest argument)
            print(f"[{tag}] pytest exited {code} with no test results; its output ends:\n{out[-3000:]}")
    lines, regressions = compare(files, unpatched, patched)
    print("\n".join(lines))
    if args.list:
        for t in sorted(set(unpatched) | set(patched)):
            print(f"  {unpatched.get(t, 'absent'):>8} {patched.get(t, 'absent'):>8}  {t}")
    from accelpatch.testing.diffusers_tests_plugin import NOTHING_PATCHED, nothing_patched, summary_lines

    if summary is not None:
        print("accelpatch plugin (patched run): " + "\n".join(summary_lines(summary)))
    nothing = summary is None or nothing_patched(summary)
    if nothing:
        print(NOTHING_PATCHED if summary is not None else "accelpatch plugin wrote no summary (see the output above)")
    if regressions:
        print(f"FAILED: {len(regressions)} test(s) fail only with accelpatch applied")
        return 1
    return 1 if nothing and unpatched else 0


if __name__ == "__main__":
    sys.exit(main())

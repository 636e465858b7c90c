"""The demo runs end to end offline and reports the contract it demonstrates."""
import re

import pytest

from accelpatch.__main__ import main
from accelpatch.tools.demo import run_demo


def test_demo_table_reports_bit_identity_and_the_cpu_rejection():
    text = run_demo(steps=2, dtype="fp32", repeats=1, progress=False)
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines()
            if re.match(r"(unpatched|patched, \w+)\s", line)}
    assert set(rows) == {"unpatched", "patched, default", "patched, exact", "patched, lossless", "patched, high"}
    for label in ("unpatched", "patched, default", "patched, exact", "patched, lossless"):
        assert re.search(r"\byes\s+inf\s+1\.0000\s+0\s+0$", rows[label]), rows[label]
    # On CPU the high tier's fast path cannot mount: it falls back (counted) and stays bit-identical.
    assert re.search(r"\byes\s+inf\s+1\.0000\s+0\s+[1-9]\d*$", rows["patched, high"]), rows["patched, high"]
    assert "CUDA is unavailable" in text
    assert text.rstrip().endswith("bit-identical to unpatched: yes")


def test_cli_rejects_a_bad_dtype_and_prints_help(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--dtype", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_demo_runs_sana_video2_from_the_command_line(capsys):
    # --model sana-video2 reaches the demo; its fast paths need CUDA, so on CPU high falls back (counted)
    assert main(["demo", "--model", "sana-video2", "--steps", "1", "--repeats", "1", "--dtype", "fp32",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("SANA-Video 2.0 demo: tiny random pipeline, fp32, cpu, 1 steps")
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines()
            if re.match(r"(unpatched|patched, \w+)\s", line)}
    assert set(rows) == {"unpatched", "patched, default", "patched, exact", "patched, lossless", "patched, high"}
    for label in ("unpatched", "patched, default", "patched, exact", "patched, lossless"):
        assert re.search(r"\byes\s+inf\s+1\.0000\s+0\s+0$", rows[label]), rows[label]
    assert re.search(r"\byes\s+inf\s+1\.0000\s+0\s+[1-9]\d*$", rows["patched, high"]), rows["patched, high"]
    assert "SanaVideo2Transformer3DModel" in text and "CUDA is unavailable" in text
    assert text.rstrip().endswith("bit-identical to unpatched: yes")


def test_cli_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--model", "sana-video3"])
    assert "invalid choice: 'sana-video3'" in capsys.readouterr().err

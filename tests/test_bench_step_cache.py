"""benchmarks/bench_step_cache.py --quick runs end to end in a subprocess and writes the JSON schema it promises:
per model and per threshold the reuse fraction, time ratio, SSIM/PSNR and a fewer-steps baseline; plus the plot."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step_cache.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    import matplotlib  # noqa: F401  (the dev extra installs it: a missing plot library fails, never skips)
    out = tmp_path_factory.mktemp("bench_step_cache")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--quiet", "--json", str(out / "r.json"),
                           "--plot", str(out / "r.png")], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "r.json").read_text()), done.stdout, out / "r.png"


def _check_quality(q):
    assert 0.0 <= q["min_ssim"] <= q["mean_ssim"] <= 1.0 + 1e-9
    assert len(q["ssim"]) == len(q["psnr"]) > 0
    if q["min_psnr"] is None:  # bit-identical frames: PSNR +inf, written as null
        assert q["identical"] and q["passes_gate"]
    else:
        assert q["min_psnr"] > 0 and (q["mean_psnr"] is None or q["mean_psnr"] >= q["min_psnr"])
    assert isinstance(q["passes_gate"], bool)


def _check_timing(t):
    for key in ("e2e", "transformer"):
        assert t[key]["time_ratio"] > 0 and t[key]["median_seconds"] > 0
        assert all(s > 0 for s in t[key]["seconds"])
        assert t[key]["speedup"]["speedup"] > 0 and isinstance(t[key]["verdict"], str)


def test_quick_run_writes_the_promised_schema(quick_run):
    result, stdout, plot = quick_run
    assert result["kind"] == "accelpatch.bench_step_cache" and result["version"] == 1 and result["quick"]
    assert [m["model"] for m in result["models"]] == ["sana-video", "minimax-h3"]
    for m in result["models"]:
        assert m["blocks"] >= 2 and m["forwards"] >= 2 and m["rounds"] >= 2
        assert m["gates"] == {"ssim_floor": 0.92, "psnr_floor": 24.0}
        thresholds = [p["threshold"] for p in m["points"] if p["variant"] == "default"]
        assert thresholds == result["thresholds"]
        baselines = {b["label"]: b for b in m["baselines"]}
        for p in m["points"]:
            assert 0.0 <= p["reuse_fraction"] <= 1.0 and p["calls"] == p["computed"] + p["reused"] > 0
            assert 1.0 / m["blocks"] - 1e-9 <= p["compute_fraction"] <= 1.0 + 1e-9
            _check_timing(p["timing"])
            _check_quality(p["quality"])
            assert p["reproducible"]
            base = p["baseline"]
            assert 1 <= base["forwards"] <= m["forwards"]
            if base["forwards"] < m["forwards"]:
                assert base["label"] in baselines
                assert set(p["beats_baseline"]) >= {"psnr", "ssim", "both"}
            else:  # saves less than one forward: the baseline is exact itself, which nothing beats
                assert not p["beats_baseline"]["both"]
        for b in m["baselines"]:
            assert b["forwards"] < m["forwards"] and 0 < b["compute_fraction"] < 1
            _check_timing(b["timing"])
            _check_quality(b["quality"])
        # threshold 0 never reuses and is bit-identical to exact
        zero = next(p for p in m["points"] if p["threshold"] == 0.0)
        assert zero["reused"] == 0 and zero["quality"]["identical"]
        # an always-reuse threshold does reuse, within the guards
        always = next(p for p in m["points"] if p["threshold"] >= 1e8)
        assert 0 < always["reuse_fraction"] < 1
        rec = m["recommended"]
        assert rec is None or rec["threshold"] in thresholds
    assert "recommended threshold" in stdout and "Random tiny weights" in stdout
    assert plot.stat().st_size > 10_000
    assert math.isfinite(result["elapsed_seconds"]) and result["elapsed_seconds"] < 60

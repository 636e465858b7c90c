"""benchmarks/bench_few_step.py (#42's table in docs/few-step.md) runs end to end in a subprocess: with the default
dense_steps=0.2, a 4-step call runs 3 of 4 steps sparse and an 8-step call 6 of 8 (75 % of Sol-Attn calls), and the
step cache's guards leave it at most one reusable step of 4. Without timing (``--rounds 0``): the shares are counts,
and the timed rounds would only repeat the calls."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_few_step.py"


def test_the_few_step_table_shows_the_share_of_sparse_steps(tmp_path):
    out = tmp_path / "few_step.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--families", "wan", "--steps", "4", "8", "--rounds", "0",
                             "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {(r["steps"], r["setting"]): r for r in json.loads(out.read_text())}
    assert set(rows) == {(4, "sol_attn"), (4, "cache"), (8, "sol_attn"), (8, "cache")}
    assert rows[4, "sol_attn"]["sparse_share"] == 0.75 and rows[8, "sol_attn"]["sparse_share"] == 0.75
    assert rows[4, "sol_attn"]["cache_reuse_share"] is None and rows[4, "cache"]["sparse_share"] is None
    # warm-up 2 and the final step leave one step of 4 that may reuse: at most 1 of 4 calls a step
    assert rows[4, "cache"]["cache_reuse_share"] <= 0.25
    assert rows[4, "sol_attn"]["worst_psnr_db"] < float("inf")  # the sparse path changed the frames: it ran
    assert "| wan | 4 | sol_attn | 75 % |" in result.stdout
    assert rows[4, "sol_attn"]["time_ratio"] is None and "| not timed |" in result.stdout  # --rounds 0: no timing

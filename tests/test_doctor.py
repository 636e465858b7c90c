"""accelpatch.doctor() and `python -m accelpatch doctor`: versions, CPU features, CUDA/Triton, the CPU kernels'
state, and each fast-path family with yes, or no and the reason this environment gives."""
import io
import os
import subprocess
import sys

import torch

import accelpatch
from accelpatch.tools import doctor as doctor_module

ITEMS = ("python", "torch", "triton", "diffusers", "transformers", "accelerate", "numpy", "tested torch",
         "features", "CPU kernels", "CUDA", "Triton", "export check")


def test_doctor_names_each_item_and_every_fast_path_with_its_verdict():
    out = io.StringIO()
    text = accelpatch.doctor(file=out)
    assert out.getvalue() == text + "\n"
    lines = text.splitlines()
    for item in ITEMS:
        assert any(line.strip().startswith(item) for line in lines), item
    assert f"torch         {torch.__version__}" in text
    for name, why in doctor_module.fast_paths():
        verdict = f"{'yes' if why is None else 'no '}  {name}"
        assert verdict in text, verdict
        if why is not None:
            assert why in text


def test_a_fast_path_that_cannot_run_says_why(monkeypatch):
    monkeypatch.setenv("ACCELPATCH_CPU_KERNELS", "0")
    text = doctor_module.report_text()
    assert "no   lossless: fused CPU kernels" in text and "switched off (ACCELPATCH_CPU_KERNELS=0)" in text
    monkeypatch.setattr("accelpatch.core.sites.cuda_reject_reason", lambda: "CUDA is unavailable: (test) none")
    assert "no   high: SANA-Video 2.0 BF16 anchors\n         CUDA is unavailable: (test) none" in \
        doctor_module.report_text()


def test_the_doctor_command_exits_0_and_prints_the_report():
    env = dict(os.environ, ACCELPATCH_CPU_KERNELS="1")
    done = subprocess.run([sys.executable, "-m", "accelpatch", "doctor"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "accelpatch" in done.stdout and "fast paths (what this environment can run):" in done.stdout
    assert f"torch         {torch.__version__}" in done.stdout

"""The fused Triton kernels compiled ahead of time for sm_80 (A100) and sm_90a (H100/H200) on a CPU-only machine,
one launch per op x dtype (x layout where the strides Triton specialises on differ) at the launch configuration the
wrappers choose (accelpatch.lossless.aot, through accelpatch.core.triton_aot's stand-in driver).

Each must compile, fit the chip's per-block shared memory (A100 166,912 B, H200 232,448 B), and stay within the
budget: 0 bytes of register spills and 0 bytes of stack (an element-wise kernel has nothing to spill; any spill
means a launch configuration went wrong). And its code must be the numerics the kernels claim: compiled with
enable_fp_fusion=False, no fused multiply-add in the PTX or the SASS, no flush-to-zero, no approximate instruction.
The FMA count is shown to fail on the same kernel compiled with Triton's default fusion; where eager's own complex
multiply contracts (a build that does), the complex RoPE's fmas are exactly the intended ones. One subprocess (the
test process runs the interpreter); 57 compiles, 30 s cold on 2 shared cores (measured; 34 s with the cores busy).
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from accelpatch.lossless import aot  # noqa: E402
from accelpatch.core.triton_aot import SHARED_LIMIT, TARGETS  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPILL_BUDGET = 0  # bytes of spill stores + loads per kernel
FUSED_CHECK = "modulate fp32"  # compiled once more with enable_fp_fusion=True: the FMA count must see it

_SCRIPT = r'''
import json, sys
from accelpatch.core import triton_aot
from accelpatch.lossless import aot
from accelpatch.lossless.kernels import triton_jit
print(json.dumps(dict(kernels=sorted(k.__name__ for k in triton_jit.KERNELS),
                      defined=sorted(n for n, v in vars(triton_jit).items()
                                     if n.endswith("_kernel") and hasattr(v, "arg_names")))), flush=True)
for arch in json.loads(sys.argv[1]):
    for label in aot.CASES:
        c = aot.capture_case(arch, label)
        usage = triton_aot.inspect(c, spills=True)
        print(json.dumps(dict(arch=arch, label=label, kernel=c.name, block=c.constexpr("BLOCK"),
                              warps=c.options.num_warps, fp_fusion=c.options.enable_fp_fusion, **usage.__dict__)),
              flush=True)
for arch in json.loads(sys.argv[1]):
    for label in aot.CONTRACTED:
        c = aot.capture_case(arch, label, complex_modes=(1, 1))
        usage = triton_aot.inspect(c, spills=True)
        print(json.dumps(dict(arch=arch, contracted=label, kernel=c.name, block=c.constexpr("BLOCK"),
                              warps=c.options.num_warps, fp_fusion=c.options.enable_fp_fusion,
                              modes=[c.constexpr("RE_MODE"), c.constexpr("IM_MODE")], **usage.__dict__)),
              flush=True)
for arch in json.loads(sys.argv[1]):
    for label in aot.SPLIT_CONTRACTED:
        c = aot.capture_case(arch, label, addcmul_fma=True)
        usage = triton_aot.inspect(c, spills=True)
        print(json.dumps(dict(arch=arch, split_contracted=label, kernel=c.name, block=c.constexpr("BLOCK"),
                              warps=c.options.num_warps, fp_fusion=c.options.enable_fp_fusion,
                              fma_mode=c.constexpr("FMA"), **usage.__dict__)), flush=True)
fused = triton_aot.inspect(aot.capture_case(90, sys.argv[2]), enable_fp_fusion=True)
print(json.dumps(dict(fused=fused.fma)), flush=True)
'''


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(list(TARGETS)), FUSED_CHECK],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return (rows[0], [r for r in rows if "label" in r], rows[-1], [r for r in rows if "contracted" in r],
            [r for r in rows if "split_contracted" in r])


def _where(r):
    label = r.get("label") or r.get("contracted") or r["split_contracted"]
    return f"sm_{r['arch']} {label} ({r['kernel']}, BLOCK={r['block']}, {r['warps']} warps)"


@pytest.mark.timeout(900)  # the module fixture compiles every kernel for two chips: ~1 min here
def test_every_kernel_and_case_is_compiled_for_every_target(compiled):
    kernels, rows, *_ = compiled
    assert kernels["kernels"] == kernels["defined"]  # a new kernel must join triton_jit.KERNELS (and a case here)
    assert sorted((r["arch"], r["label"]) for r in rows) == sorted((a, label) for a in TARGETS for label in aot.CASES)
    assert {r["kernel"] for r in rows} == set(kernels["kernels"])


def test_shared_memory_spills_and_stack_within_budget(compiled):
    _, rows, *_ = compiled
    for r in rows:
        assert r["shared"] <= SHARED_LIMIT[r["arch"]], f"{_where(r)}: shared {r['shared']:,} B"
        assert 0 <= r["spill_stores"] + r["spill_loads"] <= SPILL_BUDGET, (
            f"{_where(r)}: spills {r['spill_stores']} B stored, {r['spill_loads']} B loaded")
        assert r["stack"] == 0, f"{_where(r)}: stack {r['stack']} B"


def test_compiled_numerics_are_eagers(compiled):
    _, rows, *_ = compiled
    for r in rows:
        assert r["fp_fusion"] is False, _where(r)
        assert (r["fma"], r["ftz"], r["approx"]) == (0, 0, 0), (
            f"{_where(r)}: {r['fma']} fused multiply-adds, {r['ftz']} .ftz, {r['approx']} approximate instructions")


def test_the_fma_count_sees_default_fusion(compiled):
    _, _, fused, *_ = compiled
    assert fused["fused"] > 0, f"{FUSED_CHECK} compiled with enable_fp_fusion=True shows no FMA"


def test_a_contracted_complex_multiply_has_only_its_own_fmas(compiled):
    """Where the device's eager complex multiply contracts (complex_mul.FMA_FIRST), the kernel writes those fmas
    out and nothing else is contracted: 2 per pair of each of q and k, each counted once in the PTX (fma.rn.f64) and
    once in the SASS (DFMA); no spills, no .ftz or approximate instruction."""
    contracted = compiled[3]
    assert sorted((r["arch"], r["contracted"]) for r in contracted) == sorted(
        (a, label) for a in TARGETS for label in aot.CONTRACTED)
    plain = {(r["arch"], r["label"]): r for r in compiled[1]}
    for r in contracted:
        assert r["modes"] == [1, 1] and r["fp_fusion"] is False, _where(r)
        pairs_per_thread = r["block"] // (32 * r["warps"])
        assert r["fma"] == 2 * 2 * 2 * pairs_per_thread, f"{_where(r)}: {r['fma']} fmas"
        assert (r["ftz"], r["approx"], r["stack"]) == (0, 0, 0), _where(r)
        assert r["spill_stores"] + r["spill_loads"] <= SPILL_BUDGET, _where(r)
        assert r["shared"] <= SHARED_LIMIT[r["arch"]], _where(r)
        assert plain[(r["arch"], r["contracted"])]["fma"] == 0, _where(r)


def test_the_sass_fma_count_reads_operand_reuse_flags():
    """`DFMA R20, R8.reuse, R6, R20` is a fused multiply-add (ptxas marks operand-cache reuse in lowercase); plain
    ops written as FMAs with RZ or an immediate are not."""
    from accelpatch.core.triton_aot import _fused_multiply_adds  # noqa: PLC0415

    sass = """
        /*0730*/                   DFMA R28, R18.reuse, R10, R28 ;                       /* 0x0000000a121c722b */
        /*0750*/                   FFMA R18, -R18, R14.reuse, R20.reuse ;
        /*0760*/                   HFMA2.MMA R5, R5, R9, -RZ ;
        /*0770*/                   HFMA2.MMA R0, -RZ, RZ, 0, 0 ;
        /*0780*/                   FFMA R3, R2, 1, R4 ;
    """
    assert _fused_multiply_adds("", sass) == 2
    assert _fused_multiply_adds("\tfma.rn.f64 \t%rd64, %rd56, %rd1, %rd61;\n", "") == 1


def test_a_contracted_addcmul_has_only_its_own_fmas(compiled):
    """Where the device's eager addcmul_ contracts (addcmul.FMA, as this CPU's does), the split RoPE writes that fma
    out and nothing else is contracted: one per element of each of q and k, counted once in the PTX (fma.rn.f32)
    and once in the SASS (FFMA); the plain case (CUDA's functor: the product rounded first) has none."""
    split = compiled[4]
    assert sorted((r["arch"], r["split_contracted"]) for r in split) == sorted(
        (a, label) for a in TARGETS for label in aot.SPLIT_CONTRACTED)
    plain = {(r["arch"], r["label"]): r for r in compiled[1]}
    for r in split:
        assert r["fma_mode"] is True and r["fp_fusion"] is False, _where(r)
        per_thread = r["block"] // (32 * r["warps"])
        assert r["fma"] == 2 * 2 * per_thread, f"{_where(r)}: {r['fma']} fmas"
        assert (r["ftz"], r["approx"], r["stack"]) == (0, 0, 0), _where(r)
        assert r["spill_stores"] + r["spill_loads"] <= SPILL_BUDGET, _where(r)
        assert plain[(r["arch"], r["split_contracted"])]["fma"] == 0, _where(r)

"""Ahead-of-time inspection of the package's Triton kernels on a machine without a GPU.

`capture` runs the package's own host code (the wrapper that picks the launch configuration) on small CPU tensors
under a stand-in Triton driver that reports only the target, and stops every launch of the given kernels at its
compile step: what comes back is exactly what Triton's binder computed for each call (signature, constexprs,
divisibility attributes, options). `inspect` compiles one capture for its target with Triton's bundled ptxas and
reads what matters on the chip: dynamic shared memory (Triton checks it against the device's limit at the first
launch), registers and stack per thread (cuobjdump), spilled bytes (`ptxas -v`, optional: it compiles again), and
instruction counts — cp.async / wgmma in the PTX, fused multiply-adds in the SASS, flush-to-zero and approximate
instructions in the PTX (a bit-exact kernel must have none of the last three). Nothing touches a device.
TRITON_INTERPRET must be unset before the kernel modules are imported (the interpreter replaces the JIT function).
Used by accelpatch.sol_attn.op.aot and the fused kernels' AOT test.
"""
from __future__ import annotations

import contextlib
import inspect as _inspect
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Sequence

TARGETS = (80, 90)  # A100 (sm_80), H100/H200 (sm_90a)
# Per-block shared memory a kernel may opt in to (CUDA programming guide, by compute capability)
SHARED_LIMIT = {80: 166_912, 90: 232_448}


@dataclass(frozen=True)
class Capture:
    """One captured launch: the kernel (a triton JITFunction), the target and what the binder computed."""

    kernel: object
    arch: int
    signature: dict
    constexprs: dict
    attrs: dict
    options: object

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def constexpr(self, name: str):
        """A constexpr argument by name (None if the kernel has no such parameter)."""
        names = self.kernel.arg_names
        return self.constexprs.get((names.index(name),)) if name in names else None


@dataclass(frozen=True)
class Usage:
    """Resource usage and instruction counts of one compiled launch (spills -1 when not measured)."""

    shared: int
    registers: int
    stack: int
    cp_async: int
    wgmma: int
    compile_s: float
    spill_stores: int = -1
    spill_loads: int = -1
    fma: int = 0  # fused multiply-adds: float fma/mad in the PTX plus all-register FFMA/DFMA/HFMA2 in the SASS
    ftz: int = 0  # .ftz instructions in the PTX
    approx: int = 0  # approximate instructions in the PTX (div.full, ex2/rcp/sqrt/... .approx)


class StandInDriver:
    """Reports a CUDA target, device 0 and stream 0; anything else would need a GPU."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def stand_in(arch: int, kernels: Sequence, captured: list):
    """Within: launches of `kernels` append a Capture to `captured` and return without compiling or running."""
    from triton.runtime import driver  # noqa: PLC0415

    if os.environ.get("TRITON_INTERPRET") == "1" or not all(hasattr(k, "device_caches") for k in kernels):
        raise RuntimeError("ahead-of-time inspection needs TRITON_INTERPRET unset before accelpatch is imported")

    def capturer(kernel):
        params = _inspect.signature(type(kernel)._do_compile).parameters  # bound by name, across Triton versions

        def capture(*args, **kwargs):
            call = dict(zip(list(params)[1:], args), **kwargs)
            captured.append(Capture(kernel, arch, call["signature"], call["constexprs"], call["attrs"],
                                    call["options"]))
            return None  # no kernel: run() returns before any launch
        return capture

    previous = driver._active  # reset_active() would build the real driver, which fails without a GPU
    driver.set_active(StandInDriver(arch))
    for kernel in kernels:
        kernel.device_caches.clear()  # binders are made per target
        kernel._do_compile = capturer(kernel)
    try:
        yield
    finally:
        for kernel in kernels:
            del kernel._do_compile
            kernel.device_caches.clear()
        driver._active = previous


def capture(arch: int, kernels: Sequence, host_code: Callable[[], object]) -> list[Capture]:
    """The launches of `kernels` that `host_code()` makes for target `arch`, in order."""
    captured: list = []
    with stand_in(arch, kernels, captured):
        host_code()
    return captured


def _tool(name: str) -> str:
    import triton  # noqa: PLC0415

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def inspect(c: Capture, spills: bool = False, **option_overrides) -> Usage:
    """Compile `c` for its target (Triton's on-disk cache makes a repeat fast) and read its resources;
    `option_overrides` replace compile options (e.g. enable_fp_fusion=True, to see what the default would do)."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415

    options = dict(c.options.__dict__, **option_overrides)
    start = time.perf_counter()
    src = triton.compiler.ASTSource(fn=c.kernel, signature=c.signature, constexprs=c.constexprs, attrs=c.attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", c.arch, 32), options=options)
    seconds = time.perf_counter() - start
    cubin, ptx = kernel.asm["cubin"], kernel.asm["ptx"]
    registers, stack = _resource_usage(cubin)
    sass = _disassemble(cubin)
    stores, loads = _spills(ptx, c.arch, options["enable_fp_fusion"]) if spills else (-1, -1)
    return Usage(shared=int(kernel.metadata.shared), registers=registers, stack=stack,
                 cp_async=len(re.findall(r"cp\.async\.c[ag]", ptx)), wgmma=ptx.count("wgmma.mma_async"),
                 compile_s=seconds, spill_stores=stores, spill_loads=loads,
                 fma=_fused_multiply_adds(ptx, sass), ftz=len(re.findall(r"\.ftz\b", ptx)),
                 approx=len(re.findall(r"\.approx\b|\bdiv\.full\b", ptx)))


_PTX_FMA = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:fma|mad)\.rn[.\w]*\.(?:f16|bf16|f32|f64|f16x2|bf16x2)\b", re.M)
_SASS_FMA = re.compile(r"\b[DFH]FMA2?(?:\.[A-Z0-9_]+)*\s+([^;]*);")
_REGISTER = re.compile(r"^[-|]*R\d+(?:\.(?:[A-Z0-9_]+|reuse))*\|?$")  # `R8.reuse`: an operand-cache hint


def _fused_multiply_adds(ptx: str, sass: str) -> int:
    """Multiply-adds that round once: float fma/mad in the PTX, and SASS FMAs whose operands are all registers
    (ptxas also writes single ops and moves as FMAs with RZ or an immediate 1: `HFMA2.MMA R5, R5, R9, -RZ` is a
    plain fp16 multiply, `HFMA2.MMA R0, -RZ, RZ, 0, 0` a zeroing move; `R8.reuse` is still a register)."""
    sass_fmas = sum(all(_REGISTER.match(op.strip()) for op in m.group(1).split(",")) for m in _SASS_FMA.finditer(sass))
    return len(_PTX_FMA.findall(ptx)) + sass_fmas


def _with_file(data, suffix: str, command: Callable[[str], list]) -> subprocess.CompletedProcess:
    mode = "wb" if isinstance(data, bytes) else "w"
    with tempfile.NamedTemporaryFile(mode=mode, suffix=suffix) as f:
        f.write(data)
        f.flush()
        return subprocess.run(command(f.name), capture_output=True, text=True, check=True)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) per thread from `cuobjdump --dump-resource-usage` (bundled with Triton)."""
    text = _with_file(cubin, ".cubin", lambda path: [_tool("cuobjdump"), "--dump-resource-usage", path]).stdout
    return int(re.search(r"REG:(\d+)", text).group(1)), int(re.search(r"STACK:(\d+)", text).group(1))


def _disassemble(cubin: bytes) -> str:
    return _with_file(cubin, ".cubin", lambda path: [_tool("cuobjdump"), "-sass", path]).stdout


def _spills(ptx: str, arch: int, fp_fusion: bool) -> tuple[int, int]:
    """(spill store, spill load) bytes as `ptxas -v` reports them, with the flags Triton compiles with."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability  # noqa: PLC0415

    fmad = [] if fp_fusion else ["--fmad=false"]
    gpu = sm_arch_from_capability(arch)
    with tempfile.TemporaryDirectory() as tmp:
        log = _with_file(ptx, ".ptx", lambda path: [get_ptxas(arch).path, *fmad, "-v", "--regAllocOptLevel=2",
                                                     f"--gpu-name={gpu}", path, "-o",
                                                     os.path.join(tmp, "k.cubin")]).stderr
    found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return int(found.group(1)), int(found.group(2))

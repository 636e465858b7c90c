"""``accelpatch.doctor()`` and ``python -m accelpatch doctor``: what this environment is and which fast paths it can run.

Prints the versions accelpatch depends on, the CPU's features, CUDA and Triton, the fused CPU kernels' build state,
and for each family of fast paths whether it can run here, and if not, why (the same reason functions ``apply()``
asks, so the doctor and ``report()`` agree). Builds nothing and imports no diffusers:
versions are read from the installed packages' metadata.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Callable, Optional, TextIO

#: the packages whose versions decide what runs (torch internals, Triton's interpreter, diffusers' classes)
PACKAGES = ("torch", "triton", "diffusers", "transformers", "accelerate", "numpy")

#: the CPU features shown (the fused CPU kernels are built with -march=native for this CPU)
CPU_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "asimd", "sve")

#: what the tested torch range is (setup.cfg's install_requires says the same)
TESTED_TORCH = "2.11 (the GPU image's, with triton 3.6) and 2.13 (with triton 3.9) in CI; 2.15 smoke-tested by hand"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _reason(check: Callable[[], Optional[str]]) -> Optional[str]:
    try:
        return check()
    except Exception as error:  # noqa: BLE001  (a probe that breaks is itself the answer)
        return f"could not be checked: {type(error).__name__}: {error}"


def _cpu_kernels_state() -> tuple[str, Optional[str]]:
    """(how the fused CPU kernels stand, why they cannot run or None). Never builds."""
    from accelpatch.lossless.kernels import cpu_build

    off = cpu_build.switched_off()
    if off:
        return off, off
    cxx, why = cpu_build.find_compiler()
    if cxx is None:
        return f"unavailable: {why}", why
    status = cpu_build.status()
    if status is not None:
        return status, (status if status.startswith(("unavailable", "switched off")) else None)
    folder = cpu_build.default_folder()
    if folder is not None and cpu_build.library_path(folder).exists():
        return f"not loaded in this process yet; a cached build is in {folder}", None
    return (f"not built yet: the first patched call builds them (about {cpu_build.TYPICAL_BUILD_S} s on 2 cores), or "
            "run `accelpatch build-kernels` now"), None


def fast_paths() -> list[tuple[str, Optional[str]]]:
    """(fast path family, why it cannot run here or None) for each family, in tier order."""
    from accelpatch.models.sana_video.gemm import bmm_bf16_fp32_reject_reason
    from accelpatch.sol_attn.op.dispatch import impl_unavailable_reason
    from accelpatch.core.sites import cuda_reject_reason

    def triton_on_cuda() -> Optional[str]:
        return cuda_reject_reason() or impl_unavailable_reason("triton")

    return [
        ("lossless: fused CPU kernels (RoPE, modulate, SwiGLU, ...)", _cpu_kernels_state()[1]),
        ("lossless: fused Triton kernels on CUDA", _reason(triton_on_cuda)),
        ("high: SANA-Video / SANA-Video 2.0 BF16 linear attention (bmm out_dtype=float32)",
         _reason(bmm_bf16_fp32_reject_reason)),
        ("high: SANA-Video 2.0 BF16 anchors", _reason(cuda_reject_reason)),
        ("high: sol_attn impl='torch' (any device)", None),
        ("high: sol_attn impl='triton'", _reason(lambda: impl_unavailable_reason("triton"))),
    ]


def report_text() -> str:
    """The doctor's report, as printed by :func:`doctor`."""
    import torch

    from accelpatch import __version__
    from accelpatch.lossless.kernels import cpu_build
    from accelpatch.core.sites import cuda_reject_reason
    from accelpatch.core.torch_compat import describe as export_check

    lines = [f"accelpatch {__version__} doctor", "", "versions:"]
    lines.append(f"  python        {platform.python_version()} ({sys.executable})")
    for package in PACKAGES:
        version = torch.__version__ if package == "torch" else _version(package)
        lines.append(f"  {package:<13} {version}")
    lines.append(f"  tested torch  {TESTED_TORCH}")
    lines += ["", "CPU:"]
    features = cpu_build.cpu_features()
    lines.append(f"  machine       {platform.machine()}, {os.cpu_count()} cores visible, torch threads "
                 f"{torch.get_num_threads()}")
    shown = [name for name in CPU_FEATURES if name in features]
    lines.append(f"  features      {' '.join(shown) if shown else '(none of ' + ', '.join(CPU_FEATURES) + ')'}"
                 + ("" if features else " (/proc/cpuinfo cannot be read)"))
    lines.append(f"  CPU kernels   {_cpu_kernels_state()[0]}")
    lines += ["", "CUDA and Triton:"]
    cuda = cuda_reject_reason()
    if cuda is None:
        lines.append(f"  CUDA          {torch.version.cuda}: {torch.cuda.get_device_name(0)} "
                     f"({torch.cuda.device_count()} visible)")
    else:
        lines.append(f"  CUDA          {cuda}")
    triton = _version("triton")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    lines.append(f"  Triton        {'not installed' if triton == 'not installed' else triton}"
                 + (" (TRITON_INTERPRET=1: kernels run in the interpreter, for tests)" if interpret else ""))
    lines.append(f"  export check  {export_check()}")
    lines += ["", "fast paths (what this environment can run):"]
    for name, why in fast_paths():
        lines.append(f"  {'yes' if why is None else 'no '}  {name}" + ("" if why is None else f"\n         {why}"))
    return "\n".join(lines)


def doctor(file: Optional[TextIO] = None) -> str:
    """Print what this environment is and which fast paths it can run, with the reason for each that cannot;
    returns the text."""
    text = report_text()
    print(text, file=sys.stdout if file is None else file)
    return text


def main(args=None) -> int:
    doctor()
    return 0

"""Builds the CPU kernels into typed torch.library ops (``torch.ops.accelpatch_cpu``) once per machine, and says so.

The sources (cpu_kernels.cpp: the kernels, c10 headers only; cpu_ops.cpp: the op schemas and argument checks) are
compiled by ``torch.utils.cpp_extension.load`` (ninja, both files in parallel) with ``-march=native`` and the
numerics flags, into ``$XDG_CACHE_HOME/accelpatch/kernels/<key>/`` (``~/.cache`` by default). The key hashes the
sources, the flags, the op namespace, torch's version, the compiler's version and this CPU's features, so a new venv
with the same torch on the same machine reuses the build, and another torch or CPU gets its own. A build is
announced on stderr (what, why, about how long, how to do it ahead or skip it) and its time reported; a cached one
loads silently in well under a second.

``python -m accelpatch build-kernels`` builds ahead. ``ACCELPATCH_CPU_KERNELS=0`` (or ``apply(...,
cpu_kernels=False)`` per model) switches the kernels off. Failing to build is not an error: :func:`load` returns the
reason (no compiler, no ninja, the compiler's last lines, a read-only cache), one RuntimeWarning per process names
it and the fix, and the fused ops run diffusers' own chains instead (bit-identical, only not faster).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
import warnings
from importlib import resources
from pathlib import Path
from typing import Optional, Sequence

SOURCES = ("cpu_kernels.cpp", "cpu_ops.cpp")
HEADERS = ("cpu_kernels.h",)
#: the torch.library namespace of the ops (another one lets a test load a second build into the same process)
NAMESPACE = "accelpatch_cpu"
#: -ffp-contract=off and -fno-fast-math are part of the numerics: a contracted multiply-add rounds once, eager twice
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math")
#: the environment switch: 0/off/false/no switch the kernels off, 1/on/true/yes (or unset) leave them on
SWITCH = "ACCELPATCH_CPU_KERNELS"
_OFF, _ON = ("0", "off", "false", "no"), ("", "1", "on", "true", "yes")
#: what a first build takes on 2 cores: 20-26 s measured idle (AVX2 and AVX-512 EPYC), 26-35 s on a busy machine, so
#: "about 30 s"; every statement of the build time (the announcement, the doctor, build-kernels --help) reads this
TYPICAL_BUILD_S = 30
#: a build lock older than this was left by a killed build (ninja's own steps take well under it)
_STALE_LOCK_S = 900

_LOCK = threading.Lock()
_RESULT: Optional[tuple] = None
#: how this process got its kernels (for the report): None until :func:`load` ran
_STATUS: Optional[str] = None
_BUILT_S: list = []  # seconds of each compile this process ran
_WARNED: set = set()
_FAKES: set = set()
_OPS_WITH_FAKES = ("modulate", "gated_residual", "scale_to", "table_bf16", "glu_gate_bf16", "relu_rope", "rope",
                   "rotate_half", "rotary_complex", "relu_bf16_formula")


def source_text(name: str = SOURCES[0]) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def switched_off(env: Optional[dict] = None) -> Optional[str]:
    """Why the kernels are switched off by the environment (None when they are not); an unknown value is named."""
    env = os.environ if env is None else env
    value = env.get(SWITCH, "").strip().lower()
    if value in _ON:
        return None
    if value in _OFF:
        return f"switched off ({SWITCH}={env[SWITCH]})"
    return (f"switched off: {SWITCH}={env[SWITCH]!r} is none of 0/off/false/no (off) or 1/on/true/yes (on); "
            "the kernels stay off until it is one of them")


def find_compiler(env: Optional[dict] = None) -> tuple[Optional[list[str]], Optional[str]]:
    """``(command, None)`` for the C++ compiler torch's extension builder will use ($CXX, else c++), or
    ``(None, reason)``."""
    env = os.environ if env is None else env
    named = env.get("CXX")
    if named:
        argv = shlex.split(named)
        if argv and shutil.which(argv[0]):
            return argv, None
        return None, f"no C++ compiler: CXX={named!r} is not an executable (install g++, or point CXX at one)"
    path = shutil.which("c++")
    if path:
        return [path], None
    return None, "no C++ compiler (c++) on PATH: install g++ (Debian/Ubuntu: apt install g++) or set CXX"


def _compiler_version(cxx: Sequence[str]) -> str:
    try:
        done = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=60)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def cpu_features() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo ("avx2", "avx512f", "avx512_bf16", ...); empty
    where that cannot be read (another OS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cache_root(env: Optional[dict] = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accelpatch" / "kernels"


def cache_key(cxx: Sequence[str], flags: Sequence[str], namespace: str = NAMESPACE) -> str:
    """What a build depends on: the sources, flags, namespace, torch's version, the compiler and this CPU (what
    -march=native reads); not where torch is installed."""
    import torch

    parts = [source_text(name) for name in SOURCES + HEADERS]
    parts += [" ".join(flags), namespace, torch.__version__, _compiler_version(cxx), platform.machine(),
              " ".join(sorted(cpu_features()))]
    return hashlib.sha256("\n\0".join(parts).encode("utf-8")).hexdigest()[:20]


def _tail(text: str, lines: int = 12) -> str:
    """The last ``lines`` lines of a build's output, on one line (a reason is one line of a warning)."""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:]).rstrip(".")


def _say(message: str) -> None:
    """A line on stderr, where pip and tqdm report long work: a build is not a warning, and must not be silent."""
    print(f"accelpatch: {message}", file=sys.stderr, flush=True)


def _ninja_on_path() -> None:
    """torch's extension builder runs ``ninja`` from PATH; the ninja wheel installs it beside the interpreter, which
    is not on PATH when a venv's python is run without activating it. Put it there for this process."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # the PyPI wheel (a dependency of accelpatch)
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _clear_stale_lock(folder: Path) -> None:
    lock = folder / "lock"
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
    except OSError:
        pass


def default_folder() -> Optional[Path]:
    """Where this process's library is (or would be) built with the default flags; None without a compiler."""
    cxx, _ = find_compiler()
    return None if cxx is None else cache_root() / cache_key(cxx, FLAGS)


def library_path(folder: Path, namespace: str = NAMESPACE) -> Path:
    return folder / f"{namespace}.so"


def _build_with(cxx: list[str], flags: Sequence[str], env: Optional[dict], namespace: str,
                announce: bool) -> tuple[Optional[Path], Optional[str]]:
    """Build (or find cached) and load the library with ``flags``: ``(path, None)`` or ``(None, reason)``."""
    import torch
    from torch.utils import cpp_extension

    folder = cache_root(env) / cache_key(cxx, flags, namespace)
    target = library_path(folder, namespace)
    if target.is_file():
        torch.ops.load_library(str(target))
        return target, None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return None, f"the kernel cache {folder.parent} is not writable ({exc}); set XDG_CACHE_HOME to a folder that is"
    _clear_stale_lock(folder)
    _ninja_on_path()
    if announce:
        _say(f"building the fused CPU kernels for this CPU and torch {torch.__version__} (once per machine; about "
             f"{TYPICAL_BUILD_S} s on 2 cores), cached in {folder}. Build them ahead with `python -m accelpatch "
             f"build-kernels`; skip them with {SWITCH}=0 or apply(..., cpu_kernels=False).")
    start = time.perf_counter()
    sources = [str(resources.files(__package__).joinpath(name)) for name in SOURCES]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the builder's own notes on compiler versions; failures raise below
            cpp_extension.load(name=namespace, sources=sources, build_directory=str(folder), verbose=False,
                               extra_cflags=[*flags, f"-DACCELPATCH_CPU_NAMESPACE={namespace}"],
                               is_python_module=False, with_cuda=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        text = str(exc)
        if "Ninja is required" in text:
            return None, "ninja is not installed (pip install ninja), which torch's extension builder needs"
        return None, f"building the fused CPU kernels failed ({shlex.join(cxx)}): {_tail(text)}"
    _BUILT_S.append(time.perf_counter() - start)
    if announce:
        _say(f"built the fused CPU kernels in {_BUILT_S[-1]:.0f} s")
    return target, None


def _register_fakes(namespace: str) -> None:
    """The ops write into outputs their caller allocated: under fake or meta tensors (torch.compile, export) they
    do nothing, like their real kernel does to anything but those outputs."""
    import torch

    if namespace in _FAKES:
        return
    for op in _OPS_WITH_FAKES:
        torch.library.register_fake(f"{namespace}::{op}", lambda *args, **kwargs: None)
    _FAKES.add(namespace)


def build(env: Optional[dict] = None, *, namespace: str = NAMESPACE, flags: Optional[Sequence[str]] = None,
          announce: bool = True):
    """Compile (or reuse the cached) library and load it: ``(torch.ops.<namespace>, None)`` or ``(None, reason)``.
    Never raises for a missing compiler, a failed build or a library that will not load. Where ``-march=native``
    is what fails (a compiler without it), it builds once more without it."""
    import torch

    flags = FLAGS if flags is None else tuple(flags)
    cxx, reason = find_compiler(env)
    if cxx is None:
        return None, reason
    target, reason = _build_with(cxx, flags, env, namespace, announce)
    if target is None and "-march=native" in flags and "building" in (reason or ""):
        portable = tuple(f for f in flags if f != "-march=native")
        if announce:  # the build was announced once: say what this second try is, not the same again
            _say("the build failed; trying once more without -march=native")
        target, _ = _build_with(cxx, portable, env, namespace, False)
    if target is None:
        return None, reason  # the first failure: the one with the flags that were meant
    _register_fakes(namespace)
    return getattr(torch.ops, namespace), None


def _warn_unavailable(reason: str) -> None:
    """One RuntimeWarning per process and reason: what is lost, why, and what to do."""
    if reason in _WARNED:
        return
    _WARNED.add(reason)
    warnings.warn(f"accelpatch: the fused CPU kernels are unavailable: {reason.rstrip('.')}. The lossless tier runs "
                  f"diffusers' own code on CPU instead (bit-identical, not faster). {SWITCH}=0 switches them off "
                  "without this warning.", RuntimeWarning, stacklevel=3)


def load():
    """The process's kernels, built once (thread-safe): ``(torch.ops.accelpatch_cpu, None)`` or ``(None, reason)``.
    A switched-off environment is a reason too (not warned); a failed build warns once."""
    global _RESULT, _STATUS
    known = _RESULT
    if known is not None:
        return known
    with _LOCK:
        if _RESULT is None:
            off = switched_off()
            if off:
                _RESULT, _STATUS = (None, off), off
            else:
                start, builds = time.perf_counter(), len(_BUILT_S)
                _RESULT = build()
                if _RESULT[1]:
                    _STATUS = f"unavailable: {_RESULT[1]}"
                    _warn_unavailable(_RESULT[1])
                elif len(_BUILT_S) > builds:
                    _STATUS = f"built in this process in {sum(_BUILT_S[builds:]):.1f} s (once per machine, torch and CPU)"
                else:
                    _STATUS = f"loaded from the cache in {time.perf_counter() - start:.2f} s"
        return _RESULT


def status() -> Optional[str]:
    """How this process got its CPU kernels ("built in this process in 20.3 s ...", "loaded from the cache in
    0.05 s", "switched off (...)", "unavailable: ..."), or None when nothing asked for them yet. Never builds."""
    return _STATUS

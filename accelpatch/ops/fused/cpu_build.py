"""Builds the CPU kernels (cpu_kernels.cpp) with the system C++ compiler at first use and loads them with ctypes.

No torch extension machinery: the source includes only c10's BFloat16/Half headers, so it compiles in seconds. The
library is cached per user under ``$XDG_CACHE_HOME/accelpatch/kernels/<key>/`` (``~/.cache`` by default), where the
key hashes the source, the flags, the compiler's version, torch's version and the host CPU (``-march=native``). A
build happens in a private temporary folder and is moved into place with ``os.replace``, so two processes building
at once both end with a whole library. Failing to build is not an error: :func:`load` then returns the reason (no
compiler, or the compiler's last lines), and the caller runs the reference chain instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Optional, Sequence

SOURCE_NAME = "cpu_kernels.cpp"
LIBRARY_NAME = "libaccelpatch_fused_cpu.so"
ABI_VERSION = 6  # must equal ap_abi_version() in the source
#: -ffp-contract=off and -fno-fast-math are part of the numerics: a contracted multiply-add rounds once, eager twice.
FLAGS = ("-std=c++17", "-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared",
         "-fvisibility=hidden")
_TIMEOUT_S = 300

_LOCK = threading.Lock()
_RESULT: Optional[tuple[Optional[ctypes.CDLL], Optional[str]]] = None


def source_text() -> str:
    return resources.files(__package__).joinpath(SOURCE_NAME).read_text(encoding="utf-8")


def find_compiler(env: Optional[dict] = None) -> tuple[Optional[list[str]], Optional[str]]:
    """``(command, None)`` for the C++ compiler to use ($CXX, else c++/g++/clang++ on PATH), or ``(None, reason)``."""
    env = os.environ if env is None else env
    named = env.get("CXX")
    if named:
        argv = shlex.split(named)
        if argv and shutil.which(argv[0]):
            return argv, None
        return None, f"no C++ compiler found: CXX={named!r} is not an executable (install g++ or fix CXX)"
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path], None
    return None, "no C++ compiler found (install g++ or set CXX) to build accelpatch's fused CPU kernels"


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


def _host_cpu() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    return platform.machine() + "|" + flags


def cache_root(env: Optional[dict] = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accelpatch" / "kernels"


def _tail(text: str, lines: int = 12) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def _build_with(cxx: list[str], flags: Sequence[str], env: Optional[dict]) -> tuple[Optional[Path], Optional[str]]:
    """The cached library built with ``flags`` (compiled now if absent): ``(path, None)`` or ``(None, reason)``."""
    import torch

    source = source_text()
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    key_text = "\n".join([source, " ".join(flags), _compiler_version(cxx), torch.__version__, include, _host_cpu()])
    folder = cache_root(env) / hashlib.sha256(key_text.encode("utf-8")).hexdigest()[:24]
    target = folder / LIBRARY_NAME
    if target.is_file():
        return target, None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as tmp:
        src = Path(tmp) / SOURCE_NAME
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / LIBRARY_NAME
        argv = [*cxx, *flags, "-I", include, str(src), "-o", str(out)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"building the fused CPU kernels timed out after {_TIMEOUT_S} s ({shlex.join(argv)})"
        if done.returncode != 0 or not out.is_file():
            return None, (f"building the fused CPU kernels failed ({shlex.join(cxx)} exit {done.returncode}):\n"
                          + _tail(done.stderr or done.stdout))
        os.replace(out, target)  # atomic: a concurrent builder's library is replaced by an equal one
    return target, None


def build(env: Optional[dict] = None) -> tuple[Optional[ctypes.CDLL], Optional[str]]:
    """Compile (or reuse the cached) library and load it: ``(library, None)`` or ``(None, reason)``. Never raises
    for a missing compiler, a failed build or a library that will not load. Where ``-march=native`` is what fails
    (a compiler without it), it builds once more without it."""
    cxx, reason = find_compiler(env)
    if cxx is None:
        return None, reason
    try:
        target, reason = _build_with(cxx, FLAGS, env)
        if target is None:
            portable = tuple(f for f in FLAGS if f != "-march=native")
            target, _ = _build_with(cxx, portable, env)
            if target is None:
                return None, reason  # the first failure: the one with the flags that were meant
        library = ctypes.CDLL(str(target))
        version = library.ap_abi_version()
    except OSError as exc:
        return None, f"the fused CPU kernels could not be built or loaded: {exc}"
    except AttributeError:
        return None, f"{target} is not accelpatch's fused CPU kernel library (no ap_abi_version)"
    if version != ABI_VERSION:
        return None, f"{target} has kernel ABI {version}, this accelpatch expects {ABI_VERSION}"
    return library, None


def typed(library: ctypes.CDLL, name: str, nargs: int):
    """``library``'s function ``name`` as a ctypes function of ``nargs`` pointer arguments returning nothing (plain
    ``int`` addresses go straight through)."""
    address = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs))(address)


def load() -> tuple[Optional[ctypes.CDLL], Optional[str]]:
    """The process's library, built once (thread-safe): ``(library, None)`` or ``(None, reason)``."""
    global _RESULT
    known = _RESULT
    if known is not None:
        return known
    with _LOCK:
        if _RESULT is None:
            _RESULT = build()
        return _RESULT

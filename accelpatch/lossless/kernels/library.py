"""What a fused op's kernel is: a :class:`Kernel` (the function and the op's own input checks) of a
:class:`KernelLibrary` (one device type's kernels: the checks every kernel there shares, and whether any of them can
run in this process). Each op's file (``accelpatch/lossless/ops/<name>.py``) makes its kernels with the
``FusedOp.kernel`` decorator, which keeps them on the op: nothing is looked up by name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional


def _available() -> Optional[str]:
    return None


@dataclass(frozen=True)
class KernelLibrary:
    """One device type's kernels (``kernels.cpu.LIBRARY``, ``kernels.triton_kernels.LIBRARY``).

    ``admits(name, check, args, **options)`` runs the checks every kernel of the library shares, then the op's own
    ``check(*args)``, and says why the kernel cannot take ``args`` (None when it can); ``options`` come with the
    kernel's registration (say, which arguments may be complex). ``unavailable()`` says why none of its kernels can
    run in this process (None when they can)."""

    device_type: str
    #: how reasons name the library: "no CPU kernel", "no Triton kernel"
    kind: str
    admits: Callable[..., Optional[str]]
    unavailable: Callable[[], Optional[str]] = _available

    def __post_init__(self) -> None:
        _LIBRARIES.setdefault(self.device_type, self)


#: the kernel library of each device type, by device type (each registers itself when its module is imported)
_LIBRARIES: dict[str, KernelLibrary] = {}


def kernel_kind(device_type: str) -> str:
    """How reasons name ``device_type``'s kernels ("CPU", "Triton"), or the device type where no library has it."""
    library = _LIBRARIES.get(device_type)
    return library.kind if library is not None else device_type


@dataclass(frozen=True)
class Kernel:
    """One op's kernel on one device type: ``run(*args)`` returns what the op's reference chain returns, bit for
    bit, on arguments that :meth:`unsupported` admits."""

    #: the op's name (for reasons)
    name: str
    library: KernelLibrary
    run: Callable
    #: the op's own checks: ``check(*args)`` says why ``run`` cannot take ``args`` (None when it can)
    check: Callable[..., Optional[str]]
    options: Mapping[str, Any] = field(default_factory=dict)
    #: what the kernel keeps for the process on a device (its bf16 lookup tables): ``keeps(device, dtype)`` builds
    #: it when a model of that dtype is patched on that device (:meth:`FusedOp.prepare_for`), so the model's first
    #: call does not allocate it (issue #44)
    keeps: Optional[Callable[[Any, Any], Any]] = None

    def unsupported(self, *args: Any) -> Optional[str]:
        """Why this kernel cannot run these arguments (the reference's), None when it can: the library's shared
        checks, then the op's own. On CPU this builds the kernels on first use."""
        return self.library.admits(self.name, self.check, args, **self.options)

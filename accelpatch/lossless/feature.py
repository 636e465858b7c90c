"""The lossless kernels' switch as a feature of the core (:mod:`accelpatch.core.features`): ``apply(...,
cpu_kernels=False)`` keeps one model's fused ops off the compiled CPU kernels, the report says how the CPU kernel
build stands, and apply() builds the lookup tables the model's fused kernels keep (so its first call does not)."""
from __future__ import annotations

from typing import Any

from accelpatch.core.features import Feature, register
from accelpatch.lossless.verify import CPU_KERNELS, prepare_kept


class CpuKernels(Feature):
    name = CPU_KERNELS
    order = 0
    argument = "cpu_kernels"
    default = True

    def resolve(self, value: Any, options: dict) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"cpu_kernels must be True or False, got {value!r}")
        return value

    def attach(self, model: Any, patch: Any, config: Any, pipeline: Any) -> None:
        prepare_kept(model, patch.sites)
        return None

    def notes(self) -> list[str]:
        from accelpatch.lossless.kernels import cpu_build

        status = cpu_build.status()
        return [f"CPU kernels: {status}"] if status else []


FEATURE = register(CpuKernels())

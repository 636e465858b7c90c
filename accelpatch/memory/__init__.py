"""Memory: the peak of live tensor bytes of a call, measured on real tensors or planned at full size on fake ones
(issue #44). :class:`~accelpatch.memory.live_bytes.LiveBytes` is the counter both use;
:func:`~accelpatch.memory.plan.memory_plan` plans a recipe's call by stage. Names are imported on first use, so that
the command line can read sizes (:mod:`.sizes`) without importing torch."""
from accelpatch._lazy import lazy_attributes

_LAZY = {"LiveBytes": f"{__name__}.live_bytes", "module_bytes": f"{__name__}.live_bytes",
         "memory_plan": f"{__name__}.plan", "MemoryPlan": f"{__name__}.plan", "Stage": f"{__name__}.plan",
         "parse_size": f"{__name__}.sizes"}

__all__ = list(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)

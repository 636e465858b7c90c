"""Memory: the peak of live tensor bytes of a call, measured on real tensors or planned at full size on fake ones
(issue #44). :class:`~accelpatch.memory.live_bytes.LiveBytes` is the counter both use."""
from accelpatch.memory.live_bytes import LiveBytes, module_bytes

__all__ = ["LiveBytes", "module_bytes"]

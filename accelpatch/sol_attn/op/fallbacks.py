"""The record of one implementation falling back to another (the upstream kernel to ours, the Triton kernel to the
PyTorch one): calls counted by reason, the latest reason kept, one warning per distinct reason. Thread-safe."""
from __future__ import annotations

import collections
import threading
import warnings
from typing import Optional


class ImplFallbacks:
    """``record(reason)`` counts a fallback and warns the first time a reason is seen, as ``"{what}: {reason}"``."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_reason: Optional[str] = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def record(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1
            self.last_reason = reason
            first = reason not in self._warned
            self._warned.add(reason)
        if first:
            warnings.warn(f"{self.what}: {reason}", RuntimeWarning, stacklevel=4)

    def reset(self) -> None:
        """Forget every count, the latest reason and which reasons warned (tests start from here)."""
        with self._lock:
            self.counts.clear()
            self.last_reason = None
            self._warned.clear()

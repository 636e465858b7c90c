"""Where ``apply`` keeps its record on a transformer (a :class:`~accelpatch.core.patcher.ModelPatch` under one attribute
of the module's ``__dict__``), readable by every layer without importing the patcher."""
from __future__ import annotations

from typing import Any, Optional

STATE_ATTR = "_accelpatch_state"


def patch_of(model: Any) -> Optional[Any]:
    """The patch ``apply`` put on ``model`` (None when it is not patched)."""
    return model.__dict__.get(STATE_ATTR)

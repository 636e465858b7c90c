"""Where the shipped trained tiny pipelines live, and which families have one, without importing torch.

Why a module of its own: the recipe schema (:mod:`accelpatch.recipes`) names the ``trained:<family>`` models a
recipe may ask for, and those are the families whose trained folder ships in the package, not every family that can
train (a family that trains but does not ship yet would pass the schema and fail at load). Reading a folder needs no
torch; :mod:`accelpatch.tiny_models.shipped`, which loads the folders, does.
"""
from __future__ import annotations

from pathlib import Path

#: Where the shipped folders live (package data: setup.cfg [options.package_data]).
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def shipped_families() -> tuple[str, ...]:
    """Families whose trained tiny pipeline ships with this installation."""
    if not WEIGHTS_DIR.is_dir():
        return ()
    return tuple(sorted(p.name for p in WEIGHTS_DIR.iterdir() if (p / "model_index.json").is_file()))

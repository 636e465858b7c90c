"""Byte sizes as people write them (``24GiB``, ``24GB``, ``80G``) and as the memory plan prints them (GiB).

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; SI units (KB, MB, GB, TB) powers of 1000; a bare letter
(``80G``, as ``docker --memory`` and ``ulimit`` read it) is binary. A card sold as "24 GB" holds about 24 GiB, so
``24GiB`` is the budget for it (``24GB`` is 22.4 GiB: safe, a little short). Imports nothing but the standard library.
"""
from __future__ import annotations

import re

GIB = 2 ** 30

#: unit (lower case) -> bytes
UNITS = {"": 1, "b": 1,
         "k": 2 ** 10, "kib": 2 ** 10, "kb": 10 ** 3,
         "m": 2 ** 20, "mib": 2 ** 20, "mb": 10 ** 6,
         "g": 2 ** 30, "gib": 2 ** 30, "gb": 10 ** 9,
         "t": 2 ** 40, "tib": 2 ** 40, "tb": 10 ** 12}

FORMS = "a number and a unit: 24GiB, 24GB, 80G, 1.5TiB, 512MiB (GiB/G = 2**30 bytes, GB = 10**9)"


def parse_size(text: str) -> int:
    """Bytes of a size string (``"24GiB"`` -> 25769803776). Raises ValueError naming the value and the valid
    forms for anything else: no number, an unknown unit, zero or a negative size."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"budget {text!r} is not a size; write {FORMS}")
    size = int(float(match.group(1)) * UNITS[unit])
    if size <= 0:
        raise ValueError(f"budget {text!r} must be more than 0 bytes; write {FORMS}")
    return size


def gib(nbytes: int) -> str:
    """``nbytes`` in GiB with two decimals (``"2.64 GiB"``)."""
    return f"{nbytes / GIB:.2f} GiB"

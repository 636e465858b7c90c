"""What the instruments' reports share: JSON to a file, a plain-text table, and notebook display."""
from __future__ import annotations

import json
from html import escape
from typing import Optional, Sequence


def format_table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart, the first row as the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


class TextReport:
    """Mixin: ``to_json(path)`` from ``to_dict()`` (strict JSON: no NaN or infinity), ``repr`` = ``str``, and
    the table as preformatted text in a notebook."""

    def to_dict(self) -> dict:  # pragma: no cover - implemented by each report
        raise NotImplementedError

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False)
        if path is not None:
            with open(path, "w") as handle:
                handle.write(text + "\n")
        return text

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return f"<pre>{escape(str(self))}</pre>"

"""mkdocs hook: the docstrings mkdocstrings renders use Sphinx cross-reference roles (:func:`apply`,
:class:`~accelpatch.Recipe`), which Markdown leaves as text before the code span; show them as the code span alone
(with ``~``, the last dotted component, as Sphinx does)."""
import re

_ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    text = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{text}</code>"


def on_page_content(html, page, config, files):
    return _ROLE.sub(_code, html)

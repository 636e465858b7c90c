"""Moved to :mod:`accelpatch.eval.candidates` (issue #33: the evaluation tools in one package). This path still imports,
as that very module, for one release, with a DeprecationWarning."""
from accelpatch._moved import alias

alias(__name__, "accelpatch.eval.candidates")

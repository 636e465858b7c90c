"""Fingerprints of the diffusers code the fast paths restate: a diffusers upgrade declines a fast path, it does not
break it.

A fast path that restates diffusers code (a block's ``forward``, a processor's ``__call__``, a RoPE helper) names
those functions in ``FastPath.restates`` as ``"module:Qualified.name"`` strings (resolved at ``apply``, so that
``import accelpatch`` never imports diffusers). At ``apply`` each function's fingerprint is compared with the ones
recorded in :mod:`accelpatch.core.restated_fingerprints` for the diffusers versions tested: a function whose code is
not one recorded (a newer diffusers that changed it, an edited install, a function replaced at run time) declines
that fast path by name, and the model runs diffusers' own code there; every other fast path keeps working.

The fingerprint is the SHA-256 of the function's source parsed to an AST with its docstrings dropped, written
out the same way on every supported Python (:func:`canonical`): comments, blank lines, formatting, line numbers and
docstrings do not count; any change to the code does. There is deliberately no bytecode fallback: bytecode
differs between Python versions, so a recorded bytecode fingerprint would decline on every other Python anyway. A
function whose source cannot be read (a sources-less install, code built with ``exec``) declines with that reason.
Each function object is fingerprinted once (a weak cache), so the check costs one dictionary lookup per function at
each later ``apply``. The diffusers helpers a restatement calls rather than restates (``_get_qkv_projections``,
``dispatch_attention_fn``) are not fingerprinted: the fast path calls diffusers' own, as the restated code does.

Recording a new diffusers version is one command: ``python -m accelpatch.tools.fingerprints --write``.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import textwrap
import weakref
from typing import Any, Callable, Optional

#: the command that records the installed diffusers' fingerprints (named in messages)
WRITE_COMMAND = "python -m accelpatch.tools.fingerprints --write"

#: function object -> its fingerprint, or the error that kept its source from being read (str starting with "!")
_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def short_name(qualified: str) -> str:
    """``"diffusers.x.y:Class.forward"`` -> ``"Class.forward"``: how messages name a restated function."""
    return qualified.partition(":")[2] or qualified


def resolve(qualified: str) -> Callable:
    """The function ``"module:Qualified.name"`` names, as the code calls it now (a class's attribute, unwrapped).
    Raises ImportError or AttributeError when diffusers has no such function."""
    module_name, _, attributes = qualified.partition(":")
    if not attributes:
        raise ValueError(f"restated function {qualified!r} is not 'module:Qualified.name'")
    target: Any = importlib.import_module(module_name)
    for attribute in attributes.split("."):
        target = getattr(target, attribute)
    return inspect.unwrap(target)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def canonical(node: Any) -> str:
    """``node`` written out as ``ast.dump`` would, but the same on every Python this package supports: fields
    that are None or empty (``type_params`` since 3.12, which 3.13's ``ast.dump`` also omits) and the
    ``type_comment``/``kind`` annotations are left out."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={canonical(value)}" for name, value in ast.iter_fields(node)
                  if name not in ("type_comment", "kind") and value is not None and value != []]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(canonical(item) for item in node)}]"
    return repr(node)


def definition_fingerprint(definition: ast.AST) -> str:
    """SHA-256 (hex) of one parsed ``def`` without its docstrings (see the module docstring)."""
    return hashlib.sha256(canonical(_strip_docstrings(definition)).encode()).hexdigest()


def source_fingerprint(function: Callable) -> str:
    """:func:`definition_fingerprint` of ``function``'s source. Raises OSError or TypeError when the source cannot
    be read."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return definition_fingerprint(tree.body[0])


def fingerprint(function: Callable) -> str:
    """:func:`source_fingerprint`, cached per function object; ``"!<error>"`` when the source cannot be read."""
    try:
        return _FINGERPRINTS[function]
    except (KeyError, TypeError):
        pass
    try:
        found = source_fingerprint(function)
    except (OSError, TypeError, SyntaxError) as error:
        found = f"!{type(error).__name__}: {error}"
    try:
        _FINGERPRINTS[function] = found
    except TypeError:  # not weakly referenceable: computed again next time
        pass
    return found


def diffusers_version() -> str:
    try:
        import diffusers
    except ImportError:
        return "(not installed)"
    return getattr(diffusers, "__version__", "(unknown version)")


def _version_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("+")[0].split("."))


def recorded() -> dict[str, dict[str, str]]:
    """The recorded fingerprints: qualified name -> {diffusers version: fingerprint}."""
    from accelpatch.core.restated_fingerprints import FINGERPRINTS

    return FINGERPRINTS


def mismatch(qualified: str, fingerprints: Optional[dict[str, dict[str, str]]] = None) -> Optional[str]:
    """Why diffusers' ``qualified`` function is not code this fast path restates (None when its fingerprint is one
    recorded for a tested diffusers version): the reason names the function, the installed version, the tested
    ones, and what to do."""
    versions = (recorded() if fingerprints is None else fingerprints).get(qualified)
    name, installed = short_name(qualified), diffusers_version()
    if not versions:
        return (f"no fingerprint is recorded for {name}, which this fast path restates: it runs diffusers' own code "
                f"(an accelpatch packaging fault: record it with `{WRITE_COMMAND}`)")
    tested = sorted(versions, key=_version_key)
    latest = tested[-1]
    todo = f"upgrade accelpatch, or install diffusers=={latest}"
    try:
        function = resolve(qualified)
    except (ImportError, AttributeError) as error:
        return (f"diffusers {installed} has no {name} ({error}), which this fast path restates (tested: "
                f"{', '.join(tested)}): it runs diffusers' own code; {todo}")
    found = fingerprint(function)
    if found in versions.values():
        return None
    if found.startswith("!"):
        return (f"the source of diffusers {installed}'s {name} cannot be read ({found[1:]}), so it cannot be checked "
                f"against the code this fast path restates (tested: {', '.join(tested)}): it runs diffusers' own "
                f"code; install diffusers with its .py sources")
    if installed in versions:
        why = f"the {name} of diffusers {installed} was replaced or edited in place"
        todo = f"restore diffusers' own {name} (a clean diffusers=={installed})"
    else:
        why = f"tested: {', '.join(tested)}"
    return (f"diffusers {installed}'s {name} differs from the code this fast path restates ({why}): it runs "
            f"diffusers' own code; {todo}")


def restated_code_mismatch(names: tuple[str, ...]) -> Optional[str]:
    """The first of ``names`` whose code is not the restated one (see :func:`mismatch`), or None."""
    for qualified in names:
        reason = mismatch(qualified)
        if reason is not None:
            return reason
    return None

"""The documentation site (docs/, mkdocs.yml): it builds with `mkdocs build --strict` (as `make docs` and CI do), and
its API page documents every public name of ``accelpatch.__all__``. The Python blocks of its pages run in
tests/test_readme.py."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path):
    import mkdocs  # noqa: F401  (the dev extra's: a missing doc tool fails the test, it does not skip it)
    import mkdocstrings  # noqa: F401
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def _resolve(target: str):
    """The object a ``::: dotted.path`` line of the API page names."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def test_the_api_page_documents_every_public_name():
    import accelpatch

    targets = re.findall(r"^::: ([\w.]+)\s*$", (REPO / "docs" / "api.md").read_text(), flags=re.M)
    documented = {id(_resolve(target)) for target in targets}
    missing = [name for name in accelpatch.__all__
               if name != "__version__" and id(getattr(accelpatch, name)) not in documented]
    assert not missing, f"docs/api.md has no '::: ...' entry for accelpatch.{', accelpatch.'.join(missing)}"

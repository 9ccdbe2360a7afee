"""A matrix reference combination's recorded answers: recorded once, replayed against every other combination.

The suite's ``test_matches_reference`` sends the differential prompts (greedy, top-k logprobs) to the
combination a matrix declares as its ``reference`` and records the answers here; every other combination of
that server sends the same prompts and is compared with the recording (first divergence, top-k both ways,
|Δlogprob| before it: :mod:`pytest_llmserve.verdicts.oracles`), so the two servers never need to be up at
once. A recording may also come from an earlier run (``--llmserve-reference-answers``), e.g. another machine.

File format (``schema`` 1; a run writes ``<results run dir>/reference-answers/<server>.json``)::

    {"schema": 1, "kind": "llmserve-reference-answers", "server": "dsa",
     "combination": "dsa[nsa_decode_backend=flashmla_sparse,cuda_graph=on(1,2,4,8)]",
     "model": "/models/dsa-tiny", "model_safetensors_sha256": "…" | null,
     "engine": "sglang", "engine_version": "0.5.15" | null, "recorded_at": ISO-8601,
     "max_tokens": 32, "logprobs": 5,
     "prompts": [{"text": …, "chat": false, "name": …}, …],
     "answers": [{"request": {…}, "status": 200, "text": …, "tokens": [{"token", "logprob", "top"}], …}, …]}

Model identity is the path (or hub id) and, where the model directory has one, the
``model_safetensors_sha256`` of its ``llmserve-checkpoint.json`` (written by the tiny-checkpoint builder):
when both sides have that hash it alone decides (a copy of the model elsewhere is the same model), else the
paths must match. A recording of another model, prompts, length or top-k is refused naming the differing
fields. A file is written once: recording over an existing one is refused (nothing stored is overwritten).
A non-finite logprob is NaN evidence and is kept as it came, written ``"nan"``, ``"-inf"`` or ``"inf"``
(:func:`~pytest_llmserve.json_encoding.keep_nonfinite`; the file is strict JSON).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_llmserve.config import ServerSpec, checkpoint_marker
from pytest_llmserve.errors import ConfigError, ReferenceAnswersError
from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.json_encoding import dumps, keep_nonfinite
from pytest_llmserve.verdicts.oracles import ProbePrompt
from pytest_llmserve.weights import SHA_KEY as SHA_KEY  # the marker's key for the weights' hash, re-exported

SCHEMA = 1
KIND = "llmserve-reference-answers"
DIR_NAME = "reference-answers"


def answers_file(directory: Path, server: str) -> Path:
    """Where a run records server ``server``'s reference answers under ``directory``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in server)
    return directory / DIR_NAME / f"{safe}.json"


def model_identity(spec: ServerSpec) -> dict[str, str | None]:
    """The model a server serves: its path or hub id, and the weights' hash where the builder left one (an
    unreadable marker gives none here: the oracles that read it report it)."""
    try:
        found = checkpoint_marker(spec)
    except ConfigError:
        found = None
    sha = found[1].get(SHA_KEY) if found is not None else None
    return {"model": spec.model, SHA_KEY: sha if isinstance(sha, str) else None}


def _prompt_dict(prompt: ProbePrompt) -> dict[str, object]:
    out: dict[str, object] = {"text": prompt.text, "chat": prompt.chat, "name": prompt.name}
    if prompt.min_context_tokens:  # only long-context probes carry it: earlier recordings stay comparable
        out["min_context_tokens"] = prompt.min_context_tokens
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def completion_to_dict(c: Completion) -> dict[str, Any]:
    return {"request": c.request, "status": c.status, "text": c.text, "finish_reason": c.finish_reason,
            "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "error": c.error,
            "tokens": [{"token": t.token, "logprob": keep_nonfinite(t.logprob),
                        "top": {k: keep_nonfinite(v) for k, v in t.top.items()}} for t in c.tokens]}


def completion_from_dict(data: Mapping[str, Any]) -> Completion:
    return Completion(request=dict(data.get("request") or {}), status=int(data["status"]),
                      text=str(data.get("text") or ""), finish_reason=data.get("finish_reason"),
                      prompt_tokens=data.get("prompt_tokens"), completion_tokens=data.get("completion_tokens"),
                      error=data.get("error"),
                      tokens=[TokenLogprob(str(t["token"]), _float(t.get("logprob")),
                                           {str(k): _float(v) for k, v in (t.get("top") or {}).items()})
                              for t in data.get("tokens") or []])


@dataclass(frozen=True, slots=True)
class ReferenceAnswers:
    """One reference combination's answers to the differential prompts, with what they depend on."""

    server: str
    combination: str  # the reference combination's spec id
    model: str | None
    model_sha256: str | None
    engine: str
    engine_version: str | None
    max_tokens: int
    logprobs: int
    prompts: tuple[ProbePrompt, ...]
    answers: tuple[Completion, ...]
    recorded_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    path: Path | None = None  # where it was read from or written to

    def to_dict(self) -> dict[str, object]:
        return {"schema": SCHEMA, "kind": KIND, "server": self.server, "combination": self.combination,
                "model": self.model, SHA_KEY: self.model_sha256, "engine": self.engine,
                "engine_version": self.engine_version, "recorded_at": self.recorded_at,
                "max_tokens": self.max_tokens, "logprobs": self.logprobs,
                "prompts": [_prompt_dict(p) for p in self.prompts],
                "answers": [completion_to_dict(c) for c in self.answers]}

    def describe(self) -> str:
        version = f" {self.engine_version}" if self.engine_version else ""
        where = f" ({self.path})" if self.path else ""
        return f"{self.combination} on {self.engine}{version}, recorded {self.recorded_at}{where}"

    def differences(self, spec: ServerSpec, prompts: Sequence[ProbePrompt], max_tokens: int,
                    logprobs: int) -> list[str]:
        """Why these answers cannot stand for ``spec``'s reference on ``prompts``: each differing field,
        recorded vs expected ([] when they can)."""
        identity = model_identity(spec)
        out: list[str] = []
        if self.model_sha256 and identity[SHA_KEY]:
            if self.model_sha256 != identity[SHA_KEY]:
                out.append(f"{SHA_KEY}: recorded {self.model_sha256!r}, this server's {identity[SHA_KEY]!r}")
        elif self.model != identity["model"]:
            out.append(f"model: recorded {self.model!r}, this server's {identity['model']!r}")
        wanted = [_prompt_dict(p) for p in prompts]
        recorded = [_prompt_dict(p) for p in self.prompts]
        if recorded != wanted:
            changed = [i for i in range(max(len(recorded), len(wanted)))
                       if i >= len(recorded) or i >= len(wanted) or recorded[i] != wanted[i]]
            out.append(f"prompts: {len(recorded)} recorded, {len(wanted)} sent here; they differ at "
                       f"{', '.join(f'#{i + 1}' for i in changed[:5])}"
                       + (f" (recorded {recorded[changed[0]]['text']!r}, here {wanted[changed[0]]['text']!r})"
                          if changed[0] < min(len(recorded), len(wanted)) else ""))
        if self.max_tokens != max_tokens:
            out.append(f"max_tokens: recorded {self.max_tokens}, here {max_tokens}")
        if self.logprobs != logprobs:
            out.append(f"logprobs (top-k): recorded {self.logprobs}, here {logprobs}")
        return out


def record(path: Path, answers: ReferenceAnswers) -> ReferenceAnswers:
    """Write ``answers`` to ``path``, which must not exist (a hard link from a complete temporary file: a
    concurrent writer or an earlier recording is never overwritten, and a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dumps(answers.to_dict(), indent=1))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ReferenceAnswersError(f"{path}: reference answers are recorded there already; not overwritten "
                                        "(record into a new run's directory, or move the old file away)") from None
    finally:
        os.unlink(tmp)
    return replace(answers, path=path)


def load(path: Path, where: str = "") -> ReferenceAnswers:
    """Read a recording; :class:`ReferenceAnswersError` naming the file (and ``where`` it was named) when it
    is missing, not JSON, or not a recording of this schema."""
    named = f"{where} = {str(path)!r}" if where else str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReferenceAnswersError(f"{named}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ReferenceAnswersError(f"{named}: not readable as reference answers ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
        raise ReferenceAnswersError(f"{named}: not a pytest-llmserve reference-answers file of schema {SCHEMA} "
                                    f"(kind {data.get('kind') if isinstance(data, dict) else None!r})")
    try:
        return ReferenceAnswers(
            server=str(data["server"]), combination=str(data["combination"]), model=data.get("model"),
            model_sha256=data.get(SHA_KEY), engine=str(data.get("engine")), engine_version=data.get("engine_version"),
            max_tokens=int(data["max_tokens"]), logprobs=int(data["logprobs"]),
            prompts=tuple(ProbePrompt(str(p["text"]), bool(p.get("chat")), str(p.get("name") or ""),
                                      int(p.get("min_context_tokens") or 0))
                          for p in data["prompts"]),
            answers=tuple(completion_from_dict(a) for a in data["answers"]), recorded_at=str(data.get("recorded_at")),
            path=path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReferenceAnswersError(f"{named}: a reference-answers file with a missing or malformed field "
                                    f"({type(exc).__name__}: {exc})") from None


def given_file(given: Path, server: str) -> Path:
    """``--llmserve-reference-answers`` names a file, or a folder holding ``<server>.json``: a run's
    ``reference-answers/`` folder, or the run's report directory above it."""
    if not given.is_dir():
        return given
    inside = answers_file(given, server)  # given the run's report directory
    beside = given / inside.name  # given its reference-answers/ folder
    return beside if beside.is_file() else inside

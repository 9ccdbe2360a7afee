"""The served model's own ``config.json``, read from the spec's model folder, with the override args the engine is
given applied: today, a DeepSeek Sparse Attention model's ``index_topk``.

A DSA model (DeepSeek-V3.2, GLM-5) attends to the ``index_topk`` tokens its indexer selects; the long-context probes
(:mod:`pytest_llmserve.verdicts.long_context`) must exceed it. The configuration, not a running server, decides them,
so a matrix reference's recording and its replays agree without the reference up. A user may serve the same weights
with another topk: SGLang's ``--json-model-override-args '{"index_topk": 1024}'``, vLLM's ``--hf-overrides``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError

#: The engines' flags that override fields of the model's config.json with a JSON object: SGLang's, vLLM's.
OVERRIDE_FLAGS = ("--json-model-override-args", "--hf-overrides")


@dataclass(frozen=True, slots=True)
class IndexTopk:
    """A DSA model's index_topk as served (``value``: config.json's, or the override args' where they set one) and
    where it came from."""

    value: int
    source: str
    # config.json's own index_topk where the override args replaced it (None: ``value`` is config.json's). Kept
    # because a probe must exceed both: the same weights may be served either way in one comparison.
    configured: int | None = None

    @property
    def largest(self) -> int:
        """The topk a probe must exceed to show selection on the model whichever way it is served."""
        return self.value if self.configured is None else max(self.value, self.configured)


def _positive_topk(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: index_topk = {value!r}: must be a positive integer")
    return value


def _override(args: tuple[str, ...], where: str) -> tuple[str, dict[str, object]] | None:
    """The last override flag in ``args`` (``--flag VALUE`` or ``--flag=VALUE``) and its JSON object: the engine's
    argument parser takes the last one given."""
    found: tuple[str, str] | None = None
    for i, arg in enumerate(args):
        for flag in OVERRIDE_FLAGS:
            if arg == flag and i + 1 < len(args):
                found = (flag, args[i + 1])
            elif arg.startswith(flag + "="):
                found = (flag, arg[len(flag) + 1:])
    if found is None:
        return None
    flag, text = found
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: {flag} {text!r} is not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {flag} {text!r} must be a JSON object")
    return flag, value


def dsa_index_topk(spec: ServerSpec) -> IndexTopk | None:
    """``spec``'s model's index_topk as served; None when the model folder is not here (a hub id, an attached
    server's path elsewhere) or its config.json has no index_topk (not a DSA model). A config.json or an override
    that is not a JSON object, or an index_topk that is not a positive integer, is a :class:`ConfigError`."""
    if not spec.model:
        return None
    config_file = Path(spec.model).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{config_file}: the model's config.json cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file}: the model's config.json must be a JSON object, got {type(config).__name__}")
    if "index_topk" not in config:
        return None
    configured = _positive_topk(config["index_topk"], str(config_file))
    source = f"{config_file} index_topk={configured}"
    override = _override(spec.args, f"server {spec.id} ({spec.source}) args")
    if override is None or "index_topk" not in override[1]:
        return IndexTopk(configured, source)
    flag, fields = override
    served = _positive_topk(fields["index_topk"], f"server {spec.id} ({spec.source}) {flag}")
    return IndexTopk(served, f"{source}, overridden by {flag} index_topk={served}", configured=configured)

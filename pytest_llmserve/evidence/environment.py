"""The environment a benchmark ran in, as plain JSON data that can be stored and compared.

The context itself is gathered by :func:`pytest_llmserve.gates.context.build_context` (the engine and its
version, the model, the server arguments, this host's hardware, the workload, the plugin and Python versions,
the variables a launched server inherits); this module holds what makes it data: the server arguments of a spec
(:func:`server_args`), paths under the plugin's cache written ``<cache>/...`` (:func:`portable_paths`) and secrets as
``***`` (:func:`redact_context`), all as plain JSON (:func:`pytest_llmserve.json_encoding.to_plain`).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_llmserve.config import ServerSpec, cache_dir, is_secret_name, redact_argv
from pytest_llmserve.json_encoding import to_plain

REDACTED = "***"

# Fields of ServerSpec.public_dict() left out of context["server_args"]: identity/bookkeeping
# (name, source, port, variant), where an attached server's log is read (log: a place, not a setting; and
# leaving it out keeps baselines recorded before the field existed comparable), those stored at the top
# level of the context (engine, model), and random_weights (a statement about the model, which the
# context names already; left out, baselines recorded before the key existed stay comparable). An
# attached server's url stays: this run cannot see the hardware behind it, so the url is what tells one
# remote server from another. differential_max_logprob_delta is a check's tolerance, not how the server runs.
# build: what the build is shows in python (its interpreter) and args (the server arguments it declares), as
# before the field existed, so that baselines recorded then stay comparable.
_SPEC_FIELDS_NOT_IN_ARGS = ("name", "source", "port", "variant", "log", "engine", "model", "random_weights",
                            "differential_max_logprob_delta", "build")

# String-valued keys whose names contain a secret word but are not secrets.
_NOT_SECRET_KEYS = frozenset({"tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init"})


def python_label() -> str:
    """Interpreter that ran the client, e.g. ``CPython 3.11``; patch releases are deliberately left out."""
    major, minor, _ = platform.python_version_tuple()
    return f"{platform.python_implementation()} {major}.{minor}"


# --------------------------------------------------------------------------- the context


def server_args(spec: ServerSpec) -> dict[str, Any]:
    """``spec.public_dict()`` (secrets redacted) without identity fields and those kept at the top level."""
    out = spec.public_dict()
    for name in _SPEC_FIELDS_NOT_IN_ARGS:
        out.pop(name, None)
    return to_plain(out)  # type: ignore[no-any-return]


def portable_paths(value: Any) -> Any:
    """Paths under the plugin's cache (the embedded default's venv and model) written as ``<cache>/...``,
    so a baseline recorded by one user compares with another user's run of the same set-up."""
    prefix = str(cache_dir())
    if isinstance(value, str):
        return "<cache>" + value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v) for v in value]
    return value


# --------------------------------------------------------------------------- secrets


def _redact_walk(value: Any, key: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _redact_walk(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(list(value))
        return [_redact_walk(v, None) for v in value]
    if (
        key is not None
        and isinstance(value, str)
        and value not in ("", REDACTED)
        and key not in _NOT_SECRET_KEYS
        and is_secret_name(key)
    ):
        return REDACTED
    return value


def redact_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-plain copy of ``context`` with secrets replaced by ``***``.

    Secret-looking string values (names with KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, by
    :func:`~pytest_llmserve.config.is_secret_name`) anywhere in the tree, the values of secret flags
    in every list of strings (:func:`~pytest_llmserve.config.redact_argv`), and ``server_args.api_key``.
    """
    out: dict[str, Any] = _redact_walk(to_plain(context), None)
    args = out.get("server_args")
    if isinstance(args, dict) and args.get("api_key") not in (None, "", REDACTED):
        args["api_key"] = REDACTED
    return out


def find_secrets(context: Mapping[str, Any]) -> list[str]:
    """Dotted paths of values in ``context`` that the redaction rules would hide (empty = safe to store)."""
    found: list[str] = []
    redacted = redact_context(context)
    for path, old, new in _walk_pairs(to_plain(context), redacted, ""):
        if old != new:
            found.append(path)
    return found


def _walk_pairs(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            yield from _walk_pairs(a[k], b.get(k), f"{path}.{k}" if path else k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _walk_pairs(x, y, f"{path}[{i}]")
    else:
        yield path, a, b

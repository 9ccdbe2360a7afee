"""Secrets masked, in one place: what is a secret and how each kind of record hides it, with one mask, :data:`MASK`.

What is a secret: a value under a name with KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL in it
(:func:`is_secret_name`: ``HF_TOKEN``, ``VLLM_API_KEY``; not ``TOKENIZERS_PARALLELISM``), the value of a secret
flag (:data:`SECRET_FLAGS`: ``--api-key X``, ``--api-key=X``), and the server's API key. Each record that may carry
one is masked here:

- a command line (:func:`redact_argv`): the launch line in the log, the configuration's ``args``/``argv`` in reports;
- environment variables (:func:`redact_env`): a spec's ``env``, the shell variables a launched engine inherits;
- a benchmark's context, a nested JSON tree (:func:`redact_context`, checked by :func:`find_secrets` before a
  baseline is stored);
- free text a server may echo a secret into, its log (:func:`secret_strings` finds them, :func:`redact_text`
  masks them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pytest_llmserve.json_encoding import to_plain

__all__ = ["MASK", "SECRET_FLAGS", "SECRET_WORDS", "find_secrets", "is_secret_name", "mask", "redact_argv",
           "redact_context", "redact_env", "redact_text", "secret_strings"]

#: What every masked secret is written as.
MASK = "***"

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--api_key")

# Keys of a context whose names contain a secret word but whose values are not secrets.
_NOT_SECRET_KEYS = frozenset({"tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init"})

# A value shorter than this is not looked for in free text: masking every "1" or "on" in a log hides nothing.
_MIN_SECRET_IN_TEXT = 8


def is_secret_name(name: str) -> bool:
    upper = name.upper().replace("TOKENIZER", "")  # TOKENIZERS_PARALLELISM is not a secret
    return any(word in upper for word in SECRET_WORDS)


def mask(value: str | None) -> str | None:
    """A secret field's value as recorded: :data:`MASK` when it is set, None when it is not."""
    return MASK if value else None


def redact_argv(argv: Iterable[str]) -> list[str]:
    """``argv`` with the values of secret flags (``--api-key X`` or ``--api-key=X``) as :data:`MASK`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(flag + "=" + MASK)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def redact_env(env: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Environment variables with the values of secret-named ones (:func:`is_secret_name`) as :data:`MASK`."""
    pairs = env.items() if isinstance(env, Mapping) else env
    return {name: (MASK if is_secret_name(name) else value) for name, value in pairs}


def secret_strings(api_key: str | None, argv: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """Secret strings a server may echo into its own log: the API key, the values of secret flags in its argv
    and of the secret-named variables in its environment (HF_TOKEN...); longest first, short values left out."""
    args = list(argv)
    found = [api_key or ""]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in SECRET_FLAGS:
            found.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
    found += [value for name, value in env.items() if is_secret_name(name)]
    return sorted({v for v in found if len(v) >= _MIN_SECRET_IN_TEXT}, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each of ``secrets`` (:func:`secret_strings`) as :data:`MASK`."""
    for value in secrets:
        text = text.replace(value, MASK)
    return text


# --------------------------------------------------------------------------- a context (a JSON tree)


def _redact_walk(value: object, key: str | None) -> object:
    if isinstance(value, dict):
        return {k: _redact_walk(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [_redact_walk(v, None) for v in value]
    if (
        key is not None
        and isinstance(value, str)
        and value not in ("", MASK)
        and key not in _NOT_SECRET_KEYS
        and is_secret_name(key)
    ):
        return MASK
    return value


def redact_context(context: Mapping[str, object]) -> dict[str, Any]:
    """A JSON-plain copy (:func:`~pytest_llmserve.json_encoding.to_plain`) of ``context`` with secrets as
    :data:`MASK`: secret-looking string values (:func:`is_secret_name` of their key) anywhere in the tree, the
    values of secret flags in every list of strings (:func:`redact_argv`), and ``server_args.api_key``."""
    out = _redact_walk(to_plain(context), None)
    assert isinstance(out, dict)  # a mapping's plain form is a dict, and it stays one
    args = out.get("server_args")
    if isinstance(args, dict) and args.get("api_key") not in (None, "", MASK):
        args["api_key"] = MASK
    return out


def find_secrets(context: Mapping[str, object]) -> list[str]:
    """Dotted paths of values in ``context`` that the redaction rules would hide (empty = safe to store)."""
    found: list[str] = []
    redacted = redact_context(context)
    for path, old, new in _walk_pairs(to_plain(context), redacted, ""):
        if old != new:
            found.append(path)
    return found


def _walk_pairs(a: object, b: object, path: str) -> Iterator[tuple[str, object, object]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            yield from _walk_pairs(a[k], b.get(k), f"{path}.{k}" if path else k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _walk_pairs(x, y, f"{path}[{i}]")
    else:
        yield path, a, b

"""The environment a benchmark ran in, as plain JSON data that can be stored and compared.

The context itself is gathered by :func:`pytest_llmserve.gates.context.build_context` (the engine and its
version, the model, the server arguments, this host's hardware, the workload, the plugin and Python versions,
the variables a launched server inherits); this module holds what makes it data: the server arguments of a spec
(:func:`server_args`, secrets masked by :meth:`~pytest_llmserve.config.ServerSpec.public_dict`) and paths under the
plugin's cache written ``<cache>/...`` (:func:`portable_paths`), as plain JSON
(:func:`pytest_llmserve.json_encoding.to_plain`). The context's secrets are masked by
:func:`pytest_llmserve.redaction.redact_context`.
"""

from __future__ import annotations

import platform
from typing import Any

from pytest_llmserve.config import ServerSpec, cache_dir
from pytest_llmserve.json_encoding import to_plain

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

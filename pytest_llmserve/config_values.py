"""One configuration value checked and converted, whichever file, table or source it came from.

Each function takes the raw value and ``where`` (the file, table and key: ``llmserve.toml:
[tool.llmserve.servers.a] startup_timeout_s``) and returns the value in the type the configuration keeps, or
raises a :class:`ConfigError` naming ``where``, the bad value and what is allowed. :mod:`pytest_llmserve.config`
builds the servers and workloads from them, :mod:`pytest_llmserve.settings` the benchmark defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pytest_llmserve.errors import ConfigError

_N = TypeVar("_N", int, float)


def check_known_key(key: str, value: Any, known: Collection[str], where: str) -> None:
    """A key of a table that takes only the ``known`` keys (a misspelt key must not be silently ignored)."""
    if key not in known:
        raise ConfigError(f"{where} unknown key {key!r} = {value!r} (known keys: {', '.join(sorted(known))})")


def check_table(value: Any, where: str, source: str) -> dict[str, Any]:
    """``value`` when it is a table; ``where`` names it, ``source`` the file."""
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {where} must be a table, got {value!r}")
    return value


def check_url(value: Any, where: str) -> str:
    """A server's base URL, ``http(s)://host:port``, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} = {value!r}: must be the server's base URL, 'http://host:port'")
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"{where} = {value!r}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} = {value!r}: must be the server's base URL, 'http://host:port' "
                          "(scheme http or https, and a host)")
    return value.strip()


def check_log(value: Any, where: str, source: str) -> str:
    """An attached server's log path: ``~`` expanded, a relative path taken from the configuration file's
    folder. Whether it exists is checked when the server is attached (the file may be written later)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} = {value!r}: must be the path of the server's log file")
    path = Path(value.strip()).expanduser()
    if not path.is_absolute() and not source.startswith("<"):
        path = Path(source).parent / path
    return str(path)


def parse_server_value(key: str, value: Any, where: str, source: str = "<built-in>") -> Any:
    """One key of a ``[tool.llmserve.servers.NAME]`` table (or a matrix value of it) but ``cuda_graph``, whose table
    :func:`pytest_llmserve.config.parse_cuda_graph` makes a ``CudaGraphSpec``."""
    def want(cond: bool, what: str) -> None:
        if not cond:
            raise ConfigError(f"{where} = {value!r}: must be {what}")

    if key == "url":
        return check_url(value, where)
    if key == "log":
        return check_log(value, where, source)

    if key in ("args", "argv"):
        want(isinstance(value, list) and all(isinstance(v, str | int | float) for v in value),
             "a list of strings")
        return tuple(str(v) for v in value)
    if key == "env":
        want(isinstance(value, dict), "a table of NAME = 'value'")
        return tuple(sorted((str(k), str(v)) for k, v in value.items()))
    if key == "differential_max_logprob_delta":
        want(isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
             "a number > 0 (the largest |Δlogprob| allowed before the first divergence)")
        return float(value)
    if key in ("startup_timeout_s", "request_timeout_s"):
        want(isinstance(value, int | float) and not isinstance(value, bool) and value > 0, "a number of seconds > 0")
        return float(value)
    if key == "mem_fraction":
        want(isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1,
             "a fraction in (0, 1]")
        return float(value)
    if key in ("tp", "max_batch_size", "gpu_layers", "context_size", "parallel"):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key == "gpu_layers" else 1),
             "a positive integer")
        return value
    if key in ("seed", "port"):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "a non-negative integer")
        if key == "port":
            want(value < 65536, "a port number below 65536")
        return value
    if key in ("deterministic", "eager", "flash_attention", "gpu", "random_weights", "long_context_probes"):
        want(isinstance(value, bool), "true or false")
        return value
    want(isinstance(value, str), "a string")
    return value


def parse_workload_value(key: str, value: Any, where: str) -> Any:
    """One key of a ``[tool.llmserve.workloads.NAME]`` table."""
    if key == "request_rate":
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinite", "infinity"):
            return math.inf
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        raise ConfigError(f"{where} = {value!r}: must be a positive number of requests/s or \"inf\"")
    if key == "max_concurrency":
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ConfigError(f"{where} = {value!r}: must be a positive integer")
    if key == "burstiness":
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        raise ConfigError(f"{where} = {value!r}: must be a number > 0")
    if key in ("warmup", "seed"):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ConfigError(f"{where} = {value!r}: must be a non-negative integer")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(f"{where} = {value!r}: must be a positive integer")


def parse_bool(value: str, where: str) -> bool:
    """A switch written as text (an ini value, an environment variable): 1/true/yes/on or 0/false/no/off/empty."""
    low = value.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{where} = {value!r}: must be true or false")


def parse_positive_float(value: Any, where: str, allow_zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} = {value!r}: must be a number") from None
    if math.isnan(number) or number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"{where} = {value!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return number


def parse_positive_int(value: Any, where: str) -> int:
    return _whole_number(value, where, 1, "a positive integer")


def parse_count(value: Any, where: str) -> int:
    """A number of rounds that may be 0 (``warmup_rounds = 0``: no warm-up round), whichever source it came from."""
    return _whole_number(value, where, 0, "a whole number >= 0")


def _number(value: Any, where: str, convert: Callable[[Any], _N], ok: Callable[[_N], bool], wanted: str) -> _N:
    """``convert(value)`` where ``ok`` accepts it, written as a number or as text (an ini value); never a bool."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}")
    try:
        number = convert(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}") from None
    if not ok(number):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}")
    return number


def _whole_number(value: Any, where: str, least: int, wanted: str) -> int:
    """An integer >= ``least``; not a fraction."""
    return _number(value, where, int, lambda n: n >= least and not (isinstance(value, float) and value != n), wanted)


def parse_spread(value: Any, where: str) -> float:
    """A spread (an sd of log values, ``between_run_sd``): a number in [0, 1); 0 is allowed (runs that agree)."""
    return _number(value, where, float, lambda n: 0 <= n < 1, "a fraction in [0, 1) (0.03 = 3%)")

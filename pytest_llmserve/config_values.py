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
from typing import Any, NoReturn, TypeGuard, TypeVar
from urllib.parse import urlsplit

from pytest_llmserve.errors import ConfigError

_N = TypeVar("_N", int, float)


def check_known_key(key: str, value: object, known: Collection[str], where: str) -> None:
    """A key of a table that takes only the ``known`` keys (a misspelt key must not be silently ignored)."""
    if key not in known:
        raise ConfigError(f"{where} unknown key {key!r} = {value!r} (known keys: {', '.join(sorted(known))})")


def check_table(value: object, where: str, source: str) -> dict[str, object]:
    """``value`` when it is a table; ``where`` names it, ``source`` the file."""
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {where} must be a table, got {value!r}")
    return value


def check_url(value: object, where: str) -> str:
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


def check_log(value: object, where: str, source: str) -> str:
    """An attached server's log path: ``~`` expanded, a relative path taken from the configuration file's
    folder. Whether it exists is checked when the server is attached (the file may be written later)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} = {value!r}: must be the path of the server's log file")
    path = Path(value.strip()).expanduser()
    if not path.is_absolute() and not source.startswith("<"):
        path = Path(source).parent / path
    return str(path)


# --------------------------------------------------------------------------- a server's and a workload's values

#: What one key of a server's table becomes (``cuda_graph`` aside: :func:`pytest_llmserve.config.parse_cuda_graph`).
ServerValue = str | int | float | bool | tuple[str, ...] | tuple[tuple[str, str], ...]
#: What one key of a workload's table becomes.
WorkloadValue = int | float | None


def _refuse(value: object, where: str, what: str) -> NoReturn:
    raise ConfigError(f"{where} = {value!r}: must be {what}")


def _is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool (TOML's ``true`` is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_number(value: object, where: str, what: str, *, at_most: float = math.inf,
                     finite: bool = False) -> float:
    """A number > 0 and at most ``at_most`` (finite too when ``finite``), as a float; else refused as ``what``."""
    if not _is_number(value) or not 0 < value <= at_most or (finite and not math.isfinite(value)):
        _refuse(value, where, what)
    return float(value)


def _integer(value: object, where: str, least: int, what: str) -> int:
    """An integer >= ``least`` (a float or a bool is refused)."""
    if not _is_integer(value) or value < least:
        _refuse(value, where, what)
    return value


def _words(value: object, where: str, source: str) -> tuple[str, ...]:
    """``args``, ``argv``: a list of strings (numbers written as words too)."""
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        _refuse(value, where, "a list of strings")
    return tuple(str(v) for v in value)


def _environment(value: object, where: str, source: str) -> tuple[tuple[str, str], ...]:
    """``env``: NAME = 'value' pairs, sorted."""
    if not isinstance(value, dict):
        _refuse(value, where, "a table of NAME = 'value'")
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


def _logprob_bound(value: object, where: str, source: str) -> float:
    return _positive_number(value, where, "a number > 0 (the largest |Δlogprob| allowed before the first divergence)",
                            finite=True)


def _seconds(value: object, where: str, source: str) -> float:
    return _positive_number(value, where, "a number of seconds > 0")


def _fraction(value: object, where: str, source: str) -> float:
    return _positive_number(value, where, "a fraction in (0, 1]", at_most=1)


def _count(value: object, where: str, source: str) -> int:
    """``tp``, ``max_batch_size``, ``context_size``, ``parallel``: 1 or more."""
    return _integer(value, where, 1, "a positive integer")


def _layers(value: object, where: str, source: str) -> int:
    """``gpu_layers``: 0 (none offloaded) or more."""
    return _integer(value, where, 0, "a positive integer")


def _seed(value: object, where: str, source: str) -> int:
    return _integer(value, where, 0, "a non-negative integer")


def _port(value: object, where: str, source: str) -> int:
    port = _integer(value, where, 0, "a non-negative integer")
    if port >= 65536:
        _refuse(value, where, "a port number below 65536")
    return port


def _switch(value: object, where: str, source: str) -> bool:
    if not isinstance(value, bool):
        _refuse(value, where, "true or false")
    return value


def _text(value: object, where: str, source: str) -> str:
    if not isinstance(value, str):
        _refuse(value, where, "a string")
    return value


#: A server key's parser (the value, ``where``, the configuration file); a key not listed is a string.
_SERVER_VALUES: dict[str, Callable[[object, str, str], ServerValue]] = {
    "url": lambda value, where, source: check_url(value, where),
    "log": check_log,
    "args": _words,
    "argv": _words,
    "env": _environment,
    "differential_max_logprob_delta": _logprob_bound,
    "startup_timeout_s": _seconds,
    "request_timeout_s": _seconds,
    "mem_fraction": _fraction,
    "tp": _count,
    "max_batch_size": _count,
    "context_size": _count,
    "parallel": _count,
    "gpu_layers": _layers,
    "seed": _seed,
    "port": _port,
    **dict.fromkeys(("deterministic", "eager", "flash_attention", "gpu", "random_weights", "long_context_probes"),
                    _switch),
}


def parse_server_value(key: str, value: object, where: str, source: str = "<built-in>") -> ServerValue:
    """One key of a ``[tool.llmserve.servers.NAME]`` table (or a matrix value of it) but ``cuda_graph``, whose table
    :func:`pytest_llmserve.config.parse_cuda_graph` makes a ``CudaGraphSpec``."""
    return _SERVER_VALUES.get(key, _text)(value, where, source)


_INFINITE_RATES = ("inf", "infinite", "infinity")


def _request_rate(value: object, where: str) -> float:
    """Requests per second, or ``"inf"``: every request sent at once."""
    if isinstance(value, str) and value.strip().lower() in _INFINITE_RATES:
        return math.inf
    return _positive_number(value, where, 'a positive number of requests/s or "inf"')


def _concurrency(value: object, where: str) -> int | None:
    return None if value is None else _integer(value, where, 1, "a positive integer")


#: A workload key's parser; a key not listed is a positive integer (a count or a length).
_WORKLOAD_VALUES: dict[str, Callable[[object, str], WorkloadValue]] = {
    "request_rate": _request_rate,
    "max_concurrency": _concurrency,
    "burstiness": lambda value, where: _positive_number(value, where, "a number > 0"),
    "warmup": lambda value, where: _integer(value, where, 0, "a non-negative integer"),
    "seed": lambda value, where: _integer(value, where, 0, "a non-negative integer"),
}


def parse_workload_value(key: str, value: object, where: str) -> WorkloadValue:
    """One key of a ``[tool.llmserve.workloads.NAME]`` table."""
    parse = _WORKLOAD_VALUES.get(key)
    return parse(value, where) if parse is not None else _integer(value, where, 1, "a positive integer")


def parse_bool(value: str, where: str) -> bool:
    """A switch written as text (an ini value, an environment variable): 1/true/yes/on or 0/false/no/off/empty."""
    low = value.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{where} = {value!r}: must be true or false")


def parse_positive_float(value: object, where: str, allow_zero: bool = False) -> float:
    number = _converted(value, where, float, "a number")
    if math.isnan(number) or number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"{where} = {value!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return number


def parse_positive_int(value: object, where: str) -> int:
    return _whole_number(value, where, 1, "a positive integer")


def parse_count(value: object, where: str) -> int:
    """A number of rounds that may be 0 (``warmup_rounds = 0``: no warm-up round), whichever source it came from."""
    return _whole_number(value, where, 0, "a whole number >= 0")


def _converted(value: object, where: str, convert: Callable[[Any], _N], wanted: str) -> _N:
    """``convert(value)`` (``int`` or ``float``, which take whatever converts to a number: text, numbers, objects
    with ``__float__``...); a value it refuses is named as not ``wanted``."""
    try:
        return convert(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}") from None


def _number(value: object, where: str, convert: Callable[[Any], _N], ok: Callable[[_N], bool], wanted: str) -> _N:
    """``convert(value)`` where ``ok`` accepts it, written as a number or as text (an ini value); never a bool."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}")
    number = _converted(value, where, convert, wanted)
    if not ok(number):
        raise ConfigError(f"{where} = {value!r}: must be {wanted}")
    return number


def _whole_number(value: object, where: str, least: int, wanted: str) -> int:
    """An integer >= ``least``; not a fraction."""
    return _number(value, where, int, lambda n: n >= least and not (isinstance(value, float) and value != n), wanted)


def parse_spread(value: object, where: str) -> float:
    """A spread (an sd of log values, ``between_run_sd``): a number in [0, 1); 0 is allowed (runs that agree)."""
    return _number(value, where, float, lambda n: 0 <= n < 1, "a fraction in [0, 1) (0.03 = 3%)")

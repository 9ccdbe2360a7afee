"""The package's JSON, written one way: plain data (:func:`to_plain`) encoded as strict JSON (:func:`dumps`).

The NaN policy, the one the JSON files this package writes follow (results, baselines, reference answers, the run
directory's records, caches and markers) and the payloads it hands between xdist processes are to follow:
**a non-finite float (NaN, +inf, -inf) becomes ``null``**. JSON has no NaN or infinity (Python's ``json`` writes
``NaN`` and ``Infinity`` tokens by default, which strict readers, ``jq`` and JavaScript's ``JSON.parse`` among
them, refuse), and a figure that could not be computed (the spread of one sample, a ratio over zero) is "no
value", which is what every reader of these files already takes ``null`` for. :func:`dumps` encodes with
``allow_nan=False`` after :func:`to_plain`, so it never raises on a float and never writes an invalid token.
A reader that needs a float reads ``null`` back as NaN (:func:`float_or_nan`).

Where *which* non-finite value it was is the datum, its owner keeps it as a string before encoding
(:func:`keep_nonfinite`: ``"nan"``, ``"inf"``, ``"-inf"``, which ``float()`` reads back): a workload's
``request_rate = inf`` (all requests at once; the configuration file writes it ``"inf"`` too) and a recorded
answer's NaN logprob (NaN evidence, :mod:`pytest_llmserve.store.reference_answers`).

Wire formats are not this module's: a request body, an engine's JSON argument or a safetensors header is written
where it is sent, in the form its reader expects.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["dumps", "fields_dict", "float_or_nan", "keep_nonfinite", "to_plain"]


def to_plain(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as dicts, mapping keys as strings, tuples and lists as lists,
    sets as lists sorted by ``repr``, other numbers (numpy's) as int or float, paths as strings, **non-finite floats
    as None**, anything else by ``str``."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [to_plain(v) for v in items]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, numbers.Integral):  # numpy's integers
        return int(value)
    if isinstance(value, numbers.Real):  # numpy's float32...
        return to_plain(float(value))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def fields_dict(record: DataclassInstance) -> dict[str, object]:
    """A dataclass record as the dict its JSON is: its fields in their order, nested records as dicts and containers
    copied (:func:`dataclasses.asdict`), each tuple field as a list; values otherwise as they are (the NaN policy is
    applied when it is written, :func:`dumps`)."""
    return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(record).items()}


def dumps(value: object, *, indent: int | None = None, sort_keys: bool = False,
          separators: tuple[str, str] | None = None) -> str:
    """``value`` as strict JSON text (:func:`to_plain`, then ``allow_nan=False``: never a ``NaN`` token)."""
    return json.dumps(to_plain(value), indent=indent, sort_keys=sort_keys, separators=separators, allow_nan=False)


def float_or_nan(value: Any) -> float:
    """A float field read back under the policy: ``null`` (a figure with no value) is NaN; a number, or a string
    :func:`keep_nonfinite` wrote, is its float."""
    return math.nan if value is None else float(value)


def keep_nonfinite(value: float | None) -> float | str | None:
    """A float whose non-finite value is itself the datum, written so that it survives the policy: ``"nan"``,
    ``"inf"`` or ``"-inf"`` (``float()`` reads each back); a finite value or None as it is."""
    if value is None or math.isfinite(value):
        return value
    return str(value)

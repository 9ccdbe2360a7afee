"""May a run be compared with a baseline? The context diff and the policy that decides it.

Two contexts (:func:`pytest_llmserve.gates.context.build_context`) are flattened to dotted keys and
compared. Keys under :data:`IGNORED_CONTEXT_KEYS` (identities, bookkeeping, timeouts) never count. A
comparison is allowed when nothing else differs, or only the declared variable under test does; otherwise it
is refused with every differing key named, unless a confounded comparison is forced explicitly
(:func:`comparability`). The host's identity (``hardware.*``: CPU, its instruction sets, cores, memory, GPUs)
may be allowed to differ on purpose (``allow_host_change``): the comparison then runs, and the differing host
fields travel with it (:attr:`Comparability.host_diffs`) to be printed beside the verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from pytest_llmserve.json_encoding import fields_dict, to_plain

# Context keys (dotted paths; a prefix covers everything below it) that may differ between a baseline
# and a run without making them incomparable: identities, bookkeeping, timeouts, where logs went.
IGNORED_CONTEXT_KEYS: tuple[str, ...] = (
    "recorded_at",
    "run_id",
    "log_path",
    "server_args.name",
    "server_args.source",
    "server_args.variant",
    "server_args.port",
    "server_args.log_path",
    "server_args.startup_timeout_s",
    "server_args.request_timeout_s",
    "server_args.api_key",
    "server_args.served_model_name",
    # The server's state is compared by its class (gates/context.server_state); the figures are the evidence.
    "server_state.generated_tokens_before",
    "server_state.requests_before",
    "server_state.prefix_cache_hit_tokens_before",
    "server_state.seconds_since_ready",
)

# Context keys a later version of the plugin added: a baseline recorded before has none. The comparison goes on, and
# says which of them the baseline lacks and what this run recorded (the stored baselines stay usable; a user who
# wants them compared like with like records them again). They are also read from the running server, so the check
# made from the configuration alone, before any boot, leaves them out.
ADDED_CONTEXT_KEYS: tuple[str, ...] = ("server_state",)

# Declared variables that stand for several context keys.
VARIABLE_GROUPS: dict[str, tuple[str, ...]] = {
    # Two engine builds side by side: another version and usually another interpreter/venv.
    "engine_version": ("engine_version", "server_args.python"),
    "engine_build": ("engine_version", "server_args.python"),
}
ENGINE_BUILD_VARIABLES = ("engine_version", "engine_build")

# The context keys that say which machine a run measured (server/hardware.hardware_context).
HOST_KEYS: tuple[str, ...] = ("hardware",)

Status = Literal["same", "allowed-variable", "refused", "forced"]


@dataclass(frozen=True, slots=True)
class ContextDiff:
    """One context key whose value differs (``*_present`` False: the key is absent on that side)."""

    key: str
    old: object
    new: object
    old_present: bool = True
    new_present: bool = True

    def describe(self) -> str:
        old = json.dumps(self.old) if self.old_present else "(absent)"
        new = json.dumps(self.new) if self.new_present else "(absent)"
        return f"{self.key}: {old} -> {new}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ContextDiff:
        return cls(
            key=str(data["key"]),
            old=data.get("old"),
            new=data.get("new"),
            old_present=bool(data.get("old_present", True)),
            new_present=bool(data.get("new_present", True)),
        )


def _flatten(value: object, prefix: str, out: dict[str, object]) -> dict[str, object]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value
    return out


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _diff_all(old: Mapping[str, object], new: Mapping[str, object]) -> list[ContextDiff]:
    flat_old = _flatten(to_plain(old), "", {})
    flat_new = _flatten(to_plain(new), "", {})
    diffs = []
    for key in sorted(set(flat_old) | set(flat_new)):
        in_old, in_new = key in flat_old, key in flat_new
        if in_old and in_new and flat_old[key] == flat_new[key]:
            continue
        diffs.append(ContextDiff(key, flat_old.get(key), flat_new.get(key), in_old, in_new))
    return diffs


def diff_context(
    baseline_ctx: Mapping[str, object],
    current_ctx: Mapping[str, object],
    *,
    ignore: Iterable[str] = IGNORED_CONTEXT_KEYS,
) -> list[ContextDiff]:
    """Differing keys (dotted paths, sorted) between two contexts, except those under ``ignore``."""
    ignored = tuple(ignore)
    return [d for d in _diff_all(baseline_ctx, current_ctx) if not _under(d.key, ignored)]


def append_diffs(stored_ctx: Mapping[str, object], current_ctx: Mapping[str, object]) -> list[ContextDiff]:
    """The differences that refuse appending a run to a stored baseline (:func:`diff_context`), less the added keys
    (:data:`ADDED_CONTEXT_KEYS`) absent on one side: the check made before the boot cannot know them yet, and a
    baseline recorded before the plugin kept them lacks them (its comparisons go on and say so, :func:`comparability`).
    Present on both sides they count: a run after traffic is not appended to fresh ones."""
    return [d for d in diff_context(stored_ctx, current_ctx) if not _added_key_absent_on_one_side(d)]


def _added_key_absent_on_one_side(diff: ContextDiff) -> bool:
    """An added key (:data:`ADDED_CONTEXT_KEYS`) the baseline predates, or the check before the boot cannot know yet:
    neither refuses a comparison or an append."""
    return _under(diff.key, ADDED_CONTEXT_KEYS) and not (diff.old_present and diff.new_present)


@dataclass(frozen=True, slots=True)
class Comparability:
    """Whether a baseline and a run may be compared, and why (``diffs`` holds every counted difference)."""

    status: Status
    label: str
    message: str
    variable: str | None = None
    variable_keys: tuple[str, ...] = ()
    diffs: tuple[ContextDiff, ...] = ()
    ignored: tuple[ContextDiff, ...] = ()
    #: Host fields that differ and were allowed to (``allow_host_change``); not in ``diffs``.
    host_diffs: tuple[ContextDiff, ...] = ()

    @property
    def ok(self) -> bool:
        """True unless refused ("forced" is ok to compute, but must be reported as forced)."""
        return self.status != "refused"

    @property
    def confounders(self) -> tuple[ContextDiff, ...]:
        return tuple(d for d in self.diffs if not _under(d.key, self.variable_keys))

    def to_dict(self) -> dict[str, object]:
        return fields_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparability:
        status = data.get("status")
        if status not in ("same", "allowed-variable", "refused", "forced"):
            raise ValueError(f"comparability status {status!r} is unknown")
        return cls(
            status=status,
            label=str(data.get("label", "")),
            message=str(data.get("message", "")),
            variable=data.get("variable"),
            variable_keys=tuple(data.get("variable_keys", ())),
            diffs=tuple(ContextDiff.from_dict(d) for d in data.get("diffs", ())),
            ignored=tuple(ContextDiff.from_dict(d) for d in data.get("ignored", ())),
            host_diffs=tuple(ContextDiff.from_dict(d) for d in data.get("host_diffs", ())),
        )


def is_host_key(key: str) -> bool:
    """A context key of the host's identity (``hardware.cpu_flags``...)."""
    return _under(key, HOST_KEYS)


def host_change_text(diffs: Iterable[ContextDiff]) -> str:
    """``hardware.cpu_flags: [...] -> [...]; hardware.cpu_model: ...`` for the host fields among ``diffs``."""
    return "; ".join(d.describe() for d in diffs if is_host_key(d.key))


def unknown_host(diffs: Iterable[ContextDiff]) -> bool:
    """A host field is absent on the baseline's side: it was recorded before its host's identity was."""
    return any(is_host_key(d.key) and not d.old_present and d.new_present for d in diffs)


def variable_keys(variable: str, *contexts: Mapping[str, object]) -> tuple[str, ...]:
    """Context keys a declared variable stands for.

    ``engine_version`` (alias ``engine_build``) also covers ``server_args.python`` (two builds side by
    side run from two interpreters); a bare server option (``cuda_graph``) means ``server_args.cuda_graph``.
    """
    if variable in VARIABLE_GROUPS:
        return VARIABLE_GROUPS[variable]
    if "." not in variable and not any(variable in ctx for ctx in contexts):
        return (f"server_args.{variable}",)
    return (variable,)


def comparability(
    baseline_ctx: Mapping[str, object],
    current_ctx: Mapping[str, object],
    variable: str | None = None,
    allow_confounded: bool = False,
    *,
    ignore: Iterable[str] = IGNORED_CONTEXT_KEYS,
    allow_host_change: bool = False,
) -> Comparability:
    """Decide whether ``current_ctx`` may be compared with ``baseline_ctx``.

    * ``same``: no counted key differs.
    * ``allowed-variable``: only the declared variable under test differs (labelled "engine build
      comparison" for ``engine_version``/``engine_build``, else "A/B of <variable>").
    * ``refused``: anything else differs; ``message`` lists every differing key.
    * ``forced``: would be refused, but ``allow_confounded`` is set; the report must say so.

    ``allow_host_change``: the host fields (:data:`HOST_KEYS`) may differ; they are decided as if equal and
    kept in ``host_diffs``, named in the message; any other difference is decided as above.
    """
    ignored_keys = tuple(ignore)
    every = _diff_all(baseline_ctx, current_ctx)
    counted = tuple(d for d in every if not _under(d.key, ignored_keys))
    # Added keys absent on one side: the baseline predates them (named below), or the check from the configuration
    # alone, before any boot, cannot know them yet (the comparison after measuring compares them).
    absent = tuple(d for d in counted if _added_key_absent_on_one_side(d))
    predates = tuple(d for d in absent if not d.old_present)
    counted = tuple(d for d in counted if d not in absent)
    ignored = tuple(d for d in every if _under(d.key, ignored_keys)) + absent
    host_diffs = tuple(d for d in counted if is_host_key(d.key)) if allow_host_change else ()
    others = tuple(d for d in counted if d not in host_diffs)
    decided = _decide(others, ignored, baseline_ctx, current_ctx, variable, allow_confounded)
    if predates:
        decided = replace(decided, message=decided.message + "\nthe baseline was recorded before the plugin kept "
                          + "; ".join(f"{d.key} (this run: {json.dumps(d.new)})" for d in predates))
    if not host_diffs:
        return decided
    listing = "\n".join(f"  ~ {d.describe()}" for d in host_diffs)
    return replace(decided, label=f"{decided.label}, across hosts (allowed)", host_diffs=host_diffs,
                   message=f"{decided.message}\nacross hosts on purpose (allow_host_change), the host differs in:\n"
                           f"{listing}")


def _decide(diffs: tuple[ContextDiff, ...], ignored: tuple[ContextDiff, ...], baseline_ctx: Mapping[str, object],
            current_ctx: Mapping[str, object], variable: str | None, allow_confounded: bool) -> Comparability:
    var_keys = variable_keys(variable, baseline_ctx, current_ctx) if variable else ()
    engine_build = variable in ENGINE_BUILD_VARIABLES
    var_label = "engine build comparison" if engine_build else f"A/B of {variable}"
    if not diffs:
        note = f" (the variable under test, {variable}, is the same on both sides)" if variable else ""
        return Comparability(
            "same", "same context", "contexts match" + note, variable, var_keys, diffs, ignored
        )
    confounders = [d for d in diffs if not _under(d.key, var_keys)]
    listing = "\n".join(f"  {'*' if _under(d.key, var_keys) else '-'} {d.describe()}" for d in diffs)
    if not confounders:
        message = f"{var_label}: only the variable under test differs:\n{listing}"
        return Comparability("allowed-variable", var_label, message, variable, var_keys, diffs, ignored)
    declared = (
        f"the variable under test is {variable!r}" if variable else "no variable under test was declared"
    )
    header = (
        f"{len(confounders)} context key(s) besides the variable under test differ ({declared}); "
        "the change could come from any of them"
    )
    if allow_confounded:
        message = (
            f"FORCED comparison (allow_confounded): {header}:\n{listing}\n"
            "  (* = variable under test, - = confounder)"
        )
        return Comparability(
            "forced",
            f"forced despite {len(confounders)} confounder(s)",
            message,
            variable,
            var_keys,
            diffs,
            ignored,
        )
    message = (
        f"comparison refused: {header}:\n{listing}\n  (* = variable under test, - = confounder)\n"
        "Record a new baseline for this context, declare the variable under test, or allow a "
        "confounded comparison explicitly."
    )
    return Comparability(
        "refused", f"refused: {len(confounders)} confounder(s)", message, variable, var_keys, diffs, ignored
    )

"""Comparability of a run with a baseline: ignored keys, the variable under test, confounders, forcing."""

from __future__ import annotations

from typing import Any

from pytest_llmserve.config import CudaGraphSpec
from pytest_llmserve.verdicts.comparability import (
    IGNORED_CONTEXT_KEYS,
    Comparability,
    comparability,
    diff_context,
    host_change_text,
    unknown_host,
)
from tests.unit.contexts import HW, ctx


def test_same_context_and_ignored_keys() -> None:
    a = ctx()
    b = ctx(
        port=1234, startup_timeout_s=5.0, source="other.toml", name="renamed", variant=(("cuda_graph", "on"),)
    )
    b["recorded_at"] = "now"
    assert diff_context(a, b) == []
    comp = comparability(a, b, None, False)
    assert comp.status == "same"
    assert comp.ok
    assert {d.key for d in comp.ignored} >= {"server_args.startup_timeout_s", "recorded_at"}
    assert "server_args.port" in IGNORED_CONTEXT_KEYS


def test_refused_when_memory_and_cuda_graph_both_change() -> None:
    base = ctx()
    cur = ctx(cuda_graph=CudaGraphSpec(enabled=False), mem_fraction=0.8)
    comp = comparability(base, cur, "server_args.cuda_graph", allow_confounded=False)
    assert comp.status == "refused"
    assert not comp.ok
    keys = {d.key for d in comp.diffs}
    assert keys == {
        "server_args.cuda_graph.enabled",
        "server_args.cuda_graph.batch_sizes",
        "server_args.mem_fraction",
    }
    assert [d.key for d in comp.confounders] == ["server_args.mem_fraction"]
    assert "server_args.mem_fraction: 0.9 -> 0.8" in comp.message
    assert "server_args.cuda_graph.enabled: true -> false" in comp.message
    assert "refused" in comp.message
    forced = comparability(base, cur, "cuda_graph", allow_confounded=True)
    assert forced.status == "forced"
    assert forced.ok
    assert "FORCED" in forced.message
    assert "server_args.mem_fraction" in forced.message


def test_allowed_when_only_the_variable_differs() -> None:
    base = ctx()
    cur = ctx(cuda_graph=CudaGraphSpec(enabled=False))
    for variable in ("server_args.cuda_graph", "cuda_graph"):
        comp = comparability(base, cur, variable, allow_confounded=False)
        assert comp.status == "allowed-variable"
        assert comp.ok
        assert comp.variable_keys == ("server_args.cuda_graph",)
        assert comp.label == f"A/B of {variable}"
    assert comparability(base, cur, None, False).status == "refused"


def test_engine_build_comparison_is_labelled() -> None:
    base = ctx()
    cur = ctx(engine_version="0.33.0.dev1", python="/opt/vllm-nightly/bin/python")
    comp = comparability(base, cur, "engine_version", allow_confounded=False)
    assert comp.status == "allowed-variable"
    assert comp.label == "engine build comparison"
    assert {d.key for d in comp.diffs} == {"engine_version", "server_args.python"}
    both = ctx(engine_version="0.33.0", mem_fraction=0.5)
    refused = comparability(base, both, "engine_version", allow_confounded=False)
    assert refused.status == "refused"
    assert "server_args.mem_fraction" in refused.message


def test_comparability_round_trips_and_diff_describes_absent_keys() -> None:
    a = ctx()
    b = ctx()
    b["hardware"] = dict(HW, gpu_name="NVIDIA H200")
    b["new_key"] = 1
    del b["python"]
    comp = comparability(a, b, None, False)
    text = comp.message
    assert 'hardware.gpu_name: null -> "NVIDIA H200"' in text
    assert "new_key: (absent) -> 1" in text
    assert 'python: "CPython 3.11" -> (absent)' in text
    assert Comparability.from_dict(comp.to_dict()) == comp


# --------------------------------------------------------------------------- the host's identity

FAST = ["avx", "avx2", "avx512_bf16", "avx512f", "fma"]


def on_host(**hardware: Any) -> dict[str, Any]:
    """A context recorded on the 2-core "AMD EPYC" of issue 25, its hardware changed by ``hardware``."""
    c = ctx()
    c["hardware"] = {"cpu_model": "AMD EPYC", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None,
                     "cuda": None, "cpu_vendor": "AuthenticAMD", "cpu_flags": FAST, "memory_gib": 24, **hardware}
    return c


def test_a_host_of_the_same_cpu_name_without_avx2_is_refused_naming_the_flags() -> None:
    comp = comparability(on_host(cpu_flags=["avx"]), on_host(), None, False)
    assert comp.status == "refused"
    assert [d.key for d in comp.diffs] == ["hardware.cpu_flags"]
    assert '  - hardware.cpu_flags: ["avx"] -> ["avx", "avx2", "avx512_bf16", "avx512f", "fma"]' in comp.message
    assert host_change_text(comp.diffs) == 'hardware.cpu_flags: ["avx"] -> ["avx", "avx2", "avx512_bf16", ' \
                                           '"avx512f", "fma"]'
    assert not unknown_host(comp.diffs)


def test_a_baseline_recorded_before_host_identity_is_from_an_unknown_host() -> None:
    old = ctx()
    old["hardware"] = {"cpu_model": "AMD EPYC", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None,
                       "cuda": None}  # the committed baseline's six keys
    comp = comparability(old, on_host(), None, False)
    assert comp.status == "refused" and unknown_host(comp.diffs)
    assert "hardware.cpu_flags: (absent) -> [" in comp.message and "hardware.memory_gib: (absent) -> 24" in comp.message
    # A field the current host lacks (a newer baseline read by an older plugin) is not "unknown host".
    assert not unknown_host(comparability(on_host(), old, None, False).diffs)


def test_allow_host_change_compares_across_hosts_and_names_the_host_fields() -> None:
    comp = comparability(on_host(cpu_flags=["avx"], memory_gib=16), on_host(), None, False, allow_host_change=True)
    assert comp.status == "same" and comp.ok and comp.diffs == ()
    assert [d.key for d in comp.host_diffs] == ["hardware.cpu_flags", "hardware.memory_gib"]
    assert comp.label == "same context, across hosts (allowed)"
    assert "  ~ hardware.memory_gib: 16 -> 24" in comp.message
    assert Comparability.from_dict(comp.to_dict()) == comp  # the results JSON keeps them
    assert Comparability.from_dict({"status": "same"}).host_diffs == ()  # results written before the field


def test_allow_host_change_still_refuses_any_other_difference() -> None:
    other = on_host(cpu_flags=["avx"])
    other["server_args"]["mem_fraction"] = 0.8
    comp = comparability(other, on_host(), None, False, allow_host_change=True)
    assert comp.status == "refused" and [d.key for d in comp.diffs] == ["server_args.mem_fraction"]
    assert "hardware.cpu_flags" in comp.message  # named as allowed, not as a confounder
    assert "  - server_args.mem_fraction: 0.8 -> 0.9" in comp.message


def test_the_servers_state_is_compared_by_its_class_and_a_baseline_without_it_is_named_not_refused() -> None:
    """Issue 35: a benchmark alone on a fresh boot and one after a suite's traffic are refused against each other;
    the figures beside the class are not compared; a baseline recorded before the state was kept still compares,
    and the message says what it lacks."""
    from pytest_llmserve.gates.context import server_state

    base = {"engine": "vllm-cpu", "server_state": server_state(12, 30.0)}
    fresh_again = {"engine": "vllm-cpu", "server_state": server_state(40, 95.5)}
    after = {"engine": "vllm-cpu", "server_state": server_state(52_000, 400.0)}
    assert comparability(base, fresh_again).status == "same"
    refused = comparability(base, after)
    assert refused.status == "refused"
    assert 'server_state.state: "fresh" -> "after traffic"' in refused.message
    older = comparability({"engine": "vllm-cpu"}, after)
    assert older.status == "same"
    assert 'recorded before the plugin kept server_state.state (this run: "after traffic")' in older.message
    # Before any boot (the set-up check from the configuration alone) the state is not known yet: not a difference.
    assert comparability(after, {"engine": "vllm-cpu"}).status == "same"

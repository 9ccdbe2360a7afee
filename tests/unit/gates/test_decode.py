"""DecodeCheck.matches (the differential against a reference configuration) and reference resolution."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.engines import adapter_named
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates.decode import CheckFailed, DecodeCheck, resolve_reference_spec
from tests.unit.gates.test_oracle_runs import FakeServer


class Adapter:
    # The fakes speak vLLM's counters and SGLang's log lines.
    nan_log_patterns = adapter_named("sglang").nan_log_patterns
    nan_counters = adapter_named("vllm").nan_counters

    def deterministic_flag_on(self, spec: ServerSpec) -> bool:
        return spec.deterministic


class FakeHandle:
    """What DecodeCheck needs of a ServerHandle."""

    def __init__(self, spec: ServerSpec, server: FakeServer) -> None:
        self.spec = spec
        self.spec_for_checks: ServerSpec | None = None  # launched as configured (RunningServer)
        self.fake = server
        self.adapter = Adapter()
        self.alive_checks = 0

    def client(self) -> LLMClient:
        client = LLMClient("http://fake", "m")
        client._http = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(self.fake.handle))
        return client

    def ensure_alive(self) -> None:
        self.alive_checks += 1

    def describe(self) -> str:
        return f"server {self.spec.id} at http://fake (log: /logs/{self.spec.name}.log)"


Failed = CheckFailed  # what a check that fails raises (the plugin's face makes it the test's failure)


HEALTHY = ServerSpec(name="healthy")
SCRAMBLED = ServerSpec(name="scrambled")


def test_matches_a_running_reference() -> None:
    check = DecodeCheck(FakeHandle(HEALTHY, FakeServer()))
    reference = FakeHandle(ServerSpec(name="batch1", max_batch_size=1), FakeServer())
    assert check.matches(reference, concurrent=True) is check
    report = check.reports[-1]
    assert report.ok and report.server_id == "healthy"
    assert "healthy vs reference batch1" in report.check and "all 9 at once" in report.check
    assert all(r.get("logprobs") for r in reference.fake.requests)


def test_matches_a_configured_reference_by_id_and_fails_with_both_servers_named() -> None:
    booted: list[Any] = []
    garbage = FakeHandle(SCRAMBLED, FakeServer(garbage=True))

    def reference_server(ref: str | ServerSpec) -> Any:
        booted.append(ref)
        return garbage

    check = DecodeCheck(FakeHandle(HEALTHY, FakeServer()), reference_server=reference_server)
    with pytest.raises(Failed) as info:
        check.matches("scrambled", max_tokens=8)
    message = str(info.value)
    assert booted == ["scrambled"]
    assert message.startswith("differential[healthy vs reference scrambled; 9 greedy prompts, 8 tokens")
    assert "FAILED on server healthy" in message
    assert "healthy vs scrambled: diverge at position 0" in message
    assert "server healthy at http://fake" in message
    assert message.rstrip().endswith("reference: server scrambled at http://fake (log: /logs/scrambled.log)")


def test_matches_needs_a_way_to_boot_a_named_reference() -> None:
    check = DecodeCheck(FakeHandle(HEALTHY, FakeServer()))
    with pytest.raises(Failed, match=r"matches\('other'\) needs a running server"):
        check.matches("other")

    def unavailable(ref: str | ServerSpec) -> Any:
        raise ConfigError("reference 'other' is not a configured server")

    check = DecodeCheck(FakeHandle(HEALTHY, FakeServer()), reference_server=unavailable)
    with pytest.raises(Failed, match="the reference configuration 'other' is not available"):
        check.matches("other")


def test_exact_equality_only_when_both_sides_are_deterministic() -> None:
    flip = FakeServer(flip_concurrent=True)  # ' zebra' at token 2 once more requests than the pool came in
    det = replace(HEALTHY, deterministic=True)
    ref = FakeHandle(replace(SCRAMBLED, deterministic=True), FakeServer())
    check = DecodeCheck(FakeHandle(det, flip))
    with pytest.raises(Failed, match="deterministic mode, but the tokens differ at position 2"):
        check.matches(ref)
    # One side without deterministic mode: the top-k rule, so ' zebra' (outside the top-k) is still an error
    # but worded by check_logprobs_close.
    check = DecodeCheck(FakeHandle(HEALTHY, FakeServer(flip_concurrent=True)))
    with pytest.raises(Failed, match="' zebra' is not in scrambled's top-k"):
        check.matches(ref)


def test_resolve_reference_spec() -> None:
    a0 = replace(HEALTHY, name="a", variant=(("eager", "on"),))
    a1 = replace(HEALTHY, name="a", variant=(("eager", "off"),))
    b = ServerSpec(name="b")
    cfg = LLMServeConfig(servers=(ServerSpec(name="a"), b), workloads={}, default_server="a", source="llmserve.toml",
                         matrices={"a": (a0, a1)})
    assert resolve_reference_spec(cfg, "b") is b
    assert resolve_reference_spec(cfg, "a[eager=off]") is a1
    assert resolve_reference_spec(cfg, a0) is a0
    with pytest.raises(ConfigError, match=r"'a' has 2 matrix combinations; name one of: a\[eager=on\], a\[eager=off\]"):
        resolve_reference_spec(cfg, "a")
    with pytest.raises(ConfigError, match=r"'c' is not a configured server \(configured: a\[eager=on\], "
                                          r"a\[eager=off\], b; from llmserve.toml\)"):
        resolve_reference_spec(cfg, "c")

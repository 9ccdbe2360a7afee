"""Characterization of ``resolve_settings`` (issue 36): the servers chosen, an attached ``--llmserve-url``, the
folders, the policies and the order in which bad values are named, pinned before the function was split into one
step per setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.settings import Settings, Sources, resolve_settings


def _default() -> ServerSpec:
    return ServerSpec(name="default", engine="vllm", model="/m")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    (tmp_path / "llmserve.toml").write_text('[servers.a]\nmodel = "/a"\n[servers.b]\nmodel = "/b"\n'
                                            '[matrix.a]\neager = [true, false]\n')
    (tmp_path / "answers").mkdir()
    return tmp_path


def _resolve(root: Path, cli: dict[str, Any] | None = None, ini: dict[str, Any] | None = None,
             env: dict[str, str] | None = None) -> Settings:
    return resolve_settings(root, Sources(cli=cli or {}, ini=ini or {}, env=env or {}), _default)


def test_defaults(root: Path) -> None:
    s = _resolve(root)
    assert (s.servers, s.url, [x.name for x in s.cfg.servers], s.cfg.default_server, sorted(s.cfg.matrices)) == (
        None, None, ["a", "b"], "a", ["a"])
    assert (s.baseline_dir, s.results_dir, s.bench_json, s.reference_answers) == (
        root / "baselines", root / "llmserve-results", None, None)
    assert (s.inconclusive, s.probe_concurrency, s.strict, s.configured, s.save_baseline, s.suite) == (
        "warn", None, False, True, False, False)


def test_servers_are_split_on_commas_and_star_passes(root: Path) -> None:
    assert _resolve(root, cli={"servers": " a, *,b ,"}).servers == ("a", "*", "b")


@pytest.mark.parametrize(("sources", "url", "source"), [
    ({"cli": {"url": "http://x:1"}}, "http://x:1", "--llmserve-url"),
    ({"cli": {"url": "http://x:1", "servers": "a"}}, "http://x:1", "--llmserve-url"),
    ({"env": {"PYTEST_LLMSERVE_URL": "http://e:2"}}, "http://e:2", "$PYTEST_LLMSERVE_URL"),
])
def test_an_url_replaces_the_configured_servers_by_one_attached_server(root: Path, sources: dict[str, Any], url: str,
                                                                      source: str) -> None:
    s = _resolve(root, **sources)
    assert (s.servers, s.url, s.cfg.default_server, dict(s.cfg.matrices)) == (("external",), url, "external", {})
    assert s.cfg.servers == (ServerSpec(name="external", engine="external", url=url, source=source,
                                        api_key="sk-test"),)


def test_folders_files_and_policies(root: Path) -> None:
    s = _resolve(root, cli={"baseline_dir": "b", "results_dir": "r", "benchmark_json": "out.json",
                            "reference_answers": "answers", "inconclusive": " FAIL ", "probe_concurrency": "3",
                            "strict": True})
    assert (s.baseline_dir, s.results_dir, s.bench_json, s.reference_answers) == (
        root / "b", root / "r", Path("out.json"), root / "answers")
    assert (s.inconclusive, s.probe_concurrency, s.strict) == ("fail", 3, True)


@pytest.mark.parametrize(("sources", "message"), [
    ({"cli": {"servers": "a,ghost"}},
     "--llmserve-server = 'a,ghost': no server named 'ghost' (configured: a, b; from ROOT/llmserve.toml)"),
    # the servers are checked first, before an url replaces them
    ({"cli": {"servers": "ghost", "url": "http://x:1"}},
     "--llmserve-server = 'ghost': no server named 'ghost' (configured: a, b; from ROOT/llmserve.toml)"),
    ({"ini": {"inconclusive": "maybe"}}, "ini llmserve_inconclusive = 'maybe': must be one of warn, fail"),
    ({"cli": {"reference_answers": "nope.json"}},
     "--llmserve-reference-answers = 'nope.json': no such file or directory"),
    # then the benchmark defaults, then the reference answers, then the inconclusive policy
    ({"ini": {"rounds": 5, "max_rounds": 3, "inconclusive": "maybe"}, "cli": {"reference_answers": "nope.json"}},
     "ini llmserve_max_rounds = 3 is below ini llmserve_rounds = 5: max_rounds must be >= rounds"),
    ({"ini": {"inconclusive": "maybe"}, "cli": {"reference_answers": "nope.json"}},
     "--llmserve-reference-answers = 'nope.json': no such file or directory"),
    ({"ini": {"inconclusive": "maybe", "probe_concurrency": 0}},
     "ini llmserve_inconclusive = 'maybe': must be one of warn, fail"),
    ({"ini": {"probe_concurrency": 0, "strict": "sometimes"}},
     "ini llmserve_probe_concurrency = 0: must be a positive integer"),
])
def test_bad_values_are_named_in_a_fixed_order(root: Path, sources: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _resolve(root, **sources)
    assert str(info.value).replace(str(root), "ROOT") == message

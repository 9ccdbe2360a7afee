"""Characterization of the configuration value parsers (issue 36): each key's accepted values, what they become,
and the exact message naming a bad one, pinned before their if-chains were split into one parser per kind of value."""

from __future__ import annotations

import math

import pytest

from pytest_llmserve.config import CudaGraphSpec, parse_cuda_graph
from pytest_llmserve.config_values import parse_server_value, parse_workload_value
from pytest_llmserve.errors import ConfigError

SERVER_VALUES = [
    ('url', 'http://h:1', 'http://h:1'),
    ('log', 'x.log', 'conf/x.log'),
    ('args', ['--a', 1, 2.5], ('--a', '1', '2.5')),
    ('argv', [True], ('True',)),
    ('env', {'A': 1, 'B': 'x'}, (('A', '1'), ('B', 'x'))),
    ('differential_max_logprob_delta', 0.5, 0.5),
    ('differential_max_logprob_delta', 2, 2.0),
    ('startup_timeout_s', 5, 5.0),
    ('request_timeout_s', 1.5, 1.5),
    ('mem_fraction', 1, 1.0),
    ('mem_fraction', 0.5, 0.5),
    ('tp', 2, 2),
    ('max_batch_size', 1, 1),
    ('gpu_layers', 0, 0),
    ('parallel', 3, 3),
    ('seed', 0, 0),
    ('port', 65535, 65535),
    ('deterministic', True, True),
    ('flash_attention', False, False),
    ('long_context_probes', True, True),
    ('model', '/m', '/m'),
    ('engine', 'vllm', 'vllm'),
]


SERVER_ERRORS = [
    ('url', 5,
     "f.toml: [s] url = 5: must be the server's base URL, 'http://host:port'"),
    ('log', '',
     "f.toml: [s] log = '': must be the path of the server's log file"),
    ('args', '--a',
     "f.toml: [s] args = '--a': must be a list of strings"),
    ('argv', ['a', None],
     "f.toml: [s] argv = ['a', None]: must be a list of strings"),
    ('env', ['A'],
     "f.toml: [s] env = ['A']: must be a table of NAME = 'value'"),
    ('differential_max_logprob_delta', 0,
     'f.toml: [s] differential_max_logprob_delta = 0: must be a number > 0 (the largest |Δlogprob| allowed before the first divergence)'),
    ('differential_max_logprob_delta', math.inf,
     'f.toml: [s] differential_max_logprob_delta = inf: must be a number > 0 (the largest |Δlogprob| allowed before the first divergence)'),
    ('differential_max_logprob_delta', True,
     'f.toml: [s] differential_max_logprob_delta = True: must be a number > 0 (the largest |Δlogprob| allowed before the first divergence)'),
    ('differential_max_logprob_delta', '1',
     "f.toml: [s] differential_max_logprob_delta = '1': must be a number > 0 (the largest |Δlogprob| allowed before the first divergence)"),
    ('startup_timeout_s', 0,
     'f.toml: [s] startup_timeout_s = 0: must be a number of seconds > 0'),
    ('request_timeout_s', False,
     'f.toml: [s] request_timeout_s = False: must be a number of seconds > 0'),
    ('mem_fraction', 1.1,
     'f.toml: [s] mem_fraction = 1.1: must be a fraction in (0, 1]'),
    ('mem_fraction', 0,
     'f.toml: [s] mem_fraction = 0: must be a fraction in (0, 1]'),
    ('mem_fraction', True,
     'f.toml: [s] mem_fraction = True: must be a fraction in (0, 1]'),
    ('tp', 0,
     'f.toml: [s] tp = 0: must be a positive integer'),
    ('tp', True,
     'f.toml: [s] tp = True: must be a positive integer'),
    ('tp', 1.0,
     'f.toml: [s] tp = 1.0: must be a positive integer'),
    ('gpu_layers', -1,
     'f.toml: [s] gpu_layers = -1: must be a positive integer'),
    ('context_size', 0,
     'f.toml: [s] context_size = 0: must be a positive integer'),
    ('seed', -1,
     'f.toml: [s] seed = -1: must be a non-negative integer'),
    ('seed', True,
     'f.toml: [s] seed = True: must be a non-negative integer'),
    ('port', 65536,
     'f.toml: [s] port = 65536: must be a port number below 65536'),
    ('port', -1,
     'f.toml: [s] port = -1: must be a non-negative integer'),
    ('port', '80',
     "f.toml: [s] port = '80': must be a non-negative integer"),
    ('eager', 1,
     'f.toml: [s] eager = 1: must be true or false'),
    ('gpu', 'yes',
     "f.toml: [s] gpu = 'yes': must be true or false"),
    ('random_weights', None,
     'f.toml: [s] random_weights = None: must be true or false'),
    ('model', 3,
     'f.toml: [s] model = 3: must be a string'),
    ('attention_backend', None,
     'f.toml: [s] attention_backend = None: must be a string'),
]


WORKLOAD_VALUES = [
    ('request_rate', 'inf', math.inf),
    ('request_rate', ' Infinity ', math.inf),
    ('request_rate', 'INFINITE', math.inf),
    ('request_rate', 2, 2.0),
    ('max_concurrency', None, None),
    ('max_concurrency', 4, 4),
    ('burstiness', 1, 1.0),
    ('burstiness', 0.5, 0.5),
    ('warmup', 0, 0),
    ('seed', 3, 3),
    ('num_prompts', 1, 1),
]


WORKLOAD_ERRORS = [
    ('request_rate', 0,
     'f.toml: [w] request_rate = 0: must be a positive number of requests/s or "inf"'),
    ('request_rate', True,
     'f.toml: [w] request_rate = True: must be a positive number of requests/s or "inf"'),
    ('request_rate', 'fast',
     'f.toml: [w] request_rate = \'fast\': must be a positive number of requests/s or "inf"'),
    ('max_concurrency', 0,
     'f.toml: [w] max_concurrency = 0: must be a positive integer'),
    ('max_concurrency', True,
     'f.toml: [w] max_concurrency = True: must be a positive integer'),
    ('burstiness', 0,
     'f.toml: [w] burstiness = 0: must be a number > 0'),
    ('burstiness', False,
     'f.toml: [w] burstiness = False: must be a number > 0'),
    ('warmup', -1,
     'f.toml: [w] warmup = -1: must be a non-negative integer'),
    ('seed', True,
     'f.toml: [w] seed = True: must be a non-negative integer'),
    ('num_prompts', 0,
     'f.toml: [w] num_prompts = 0: must be a positive integer'),
    ('input_len', True,
     'f.toml: [w] input_len = True: must be a positive integer'),
    ('output_len', 2.0,
     'f.toml: [w] output_len = 2.0: must be a positive integer'),
]


GRAPH_VALUES = [
    (True,
     CudaGraphSpec(enabled=True, batch_sizes=None, max_batch_size=None, mode=None)),
    (False,
     CudaGraphSpec(enabled=False, batch_sizes=None, max_batch_size=None, mode=None)),
    ({'enabled': False},
     CudaGraphSpec(enabled=False, batch_sizes=None, max_batch_size=None, mode=None)),
    ({},
     CudaGraphSpec(enabled=True, batch_sizes=None, max_batch_size=None, mode=None)),
    ({'batch_sizes': [4, 1, 2, 2]},
     CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4), max_batch_size=None, mode=None)),
    ({'max_batch_size': 8},
     CudaGraphSpec(enabled=True, batch_sizes=None, max_batch_size=8, mode=None)),
    ({'mode': 'FULL'},
     CudaGraphSpec(enabled=True, batch_sizes=None, max_batch_size=None, mode='FULL')),
    ({'enabled': False, 'max_batch_size': 4},
     CudaGraphSpec(enabled=False, batch_sizes=None, max_batch_size=4, mode=None)),
    ({'enabled': True, 'batch_sizes': [8], 'max_batch_size': 16, 'mode': 'PIECEWISE'},
     CudaGraphSpec(enabled=True, batch_sizes=(8,), max_batch_size=16, mode='PIECEWISE')),
]


GRAPH_ERRORS = [
    ('on',
     "f.toml: [s] cuda_graph = 'on': must be true/false or { enabled = true, batch_sizes = [1, 2, 4] }"),
    ({'enabled': 'yes'},
     "f.toml: [s] cuda_graph.enabled = 'yes': must be true or false"),
    ({'bogus': 1, 'other': 2},
     "f.toml: [s] cuda_graph = {'bogus': 1, 'other': 2}: unknown key(s) bogus, other (known: enabled, batch_sizes, max_batch_size, mode)"),
    ({'batch_sizes': []},
     'f.toml: [s] cuda_graph.batch_sizes = []: must be a non-empty list of positive integers'),
    ({'batch_sizes': [0]},
     'f.toml: [s] cuda_graph.batch_sizes = [0]: must be a non-empty list of positive integers'),
    ({'batch_sizes': [True]},
     'f.toml: [s] cuda_graph.batch_sizes = [True]: must be a non-empty list of positive integers'),
    ({'batch_sizes': '1'},
     "f.toml: [s] cuda_graph.batch_sizes = '1': must be a non-empty list of positive integers"),
    ({'enabled': False, 'batch_sizes': [1]},
     "f.toml: [s] cuda_graph = {'enabled': False, 'batch_sizes': [1]}: batch_sizes given but enabled = false"),
    ({'max_batch_size': 0},
     'f.toml: [s] cuda_graph.max_batch_size = 0: must be a positive integer'),
    ({'max_batch_size': True},
     'f.toml: [s] cuda_graph.max_batch_size = True: must be a positive integer'),
    ({'mode': ' '},
     "f.toml: [s] cuda_graph.mode = ' ': must be the engine's graph mode name (vLLM: FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY; SGLang: full, breakable)"),
    ({'mode': 3},
     "f.toml: [s] cuda_graph.mode = 3: must be the engine's graph mode name (vLLM: FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY; SGLang: full, breakable)"),
    ({'enabled': False, 'mode': 'FULL'},
     "f.toml: [s] cuda_graph = {'enabled': False, 'mode': 'FULL'}: mode given but enabled = false"),
]


@pytest.mark.parametrize(("key", "value", "expected"), SERVER_VALUES)
def test_server_values_and_what_they_become(key: str, value: object, expected: object) -> None:
    got = parse_server_value(key, value, f"f.toml: [s] {key}", "conf/f.toml")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("key", "value", "message"), SERVER_ERRORS)
def test_bad_server_values_are_named_with_what_is_allowed(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_server_value(key, value, f"f.toml: [s] {key}", "conf/f.toml")
    assert str(info.value) == message


@pytest.mark.parametrize(("key", "value", "expected"), WORKLOAD_VALUES)
def test_workload_values_and_what_they_become(key: str, value: object, expected: object) -> None:
    got = parse_workload_value(key, value, f"f.toml: [w] {key}")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("key", "value", "message"), WORKLOAD_ERRORS)
def test_bad_workload_values_are_named_with_what_is_allowed(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_workload_value(key, value, f"f.toml: [w] {key}")
    assert str(info.value) == message


@pytest.mark.parametrize(("value", "expected"), GRAPH_VALUES)
def test_cuda_graph_values_and_the_spec_they_make(value: object, expected: CudaGraphSpec) -> None:
    assert parse_cuda_graph(value, "f.toml: [s] cuda_graph") == expected


@pytest.mark.parametrize(("value", "message"), GRAPH_ERRORS)
def test_bad_cuda_graph_values_are_named(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cuda_graph(value, "f.toml: [s] cuda_graph")
    assert str(info.value) == message

"""The plugin's entry point (``pytest11``): the options and ini keys, the markers, the fixtures' declarations,
and the one decision of whether this run uses llmserve. Everything a run that uses it does is the face's:
:class:`pytest_llmserve.face.LLMServeFace`, one plugin object holding the hooks and the fixtures' bodies, which
this module registers once the run uses llmserve (as pytest-xdist registers its ``DSession`` only when it
distributes).

Inert unless used. A run *configures* the plugin when there is a configuration file (``[tool.llmserve]``
in pyproject.toml, or llmserve.toml) or any llmserve setting (an ``--llmserve-*`` option, an
``llmserve_*`` ini key, a ``PYTEST_LLMSERVE_*`` variable named in :data:`pytest_llmserve.options.OPTIONS`);
it *uses* it when, in addition or instead, a collected item asks for an llmserve fixture or carries an
``llmserve_*`` marker. The face is registered:

* at configuration, when the run is configured;
* at configuration on an xdist controller (``-n``, ``--tx``), configured or not: it collects nothing, so only
  its workers can tell whether they use llmserve, and it must hand them the run directory's name before they
  start; unconfigured, the face does nothing else until a worker says it used llmserve;
* otherwise when collection first meets a test that uses ``llm_server`` (:func:`pytest_generate_tests`) or an
  llmserve item (:func:`pytest_collection_modifyitems`), or a test asks for an llmserve fixture.

Until then the plugin adds no header line, registers no ``gpu`` marker, installs no signal handler, creates
no directory, starts no process and imports nothing of the package but :mod:`pytest_llmserve.options`: the
rest is imported in one place, :func:`_face_class`. Because the header, and pytest-xdist's choice of scheduler,
come before collection (and an xdist controller collects nothing), those follow the configuration only:

* header lines, the ``gpu`` marker, the ``-n`` ``--dist load`` -> ``loadgroup`` switch, and across hosts
  ``--max-worker-restart 0`` and the by-configuration scheduler: only when configured;
* the SIGTERM handler: at configuration when configured, else once an llmserve item is collected;
* the run directory: when the first server is booted (an xdist controller hands its path to the workers);
* the GPU probe: only when an llmserve item marked ``gpu`` (a server configured with ``gpu = true``
  marks its items) is collected and the run is not ``--collect-only``; a project's own ``gpu`` tests
  are left to the project.

The fixtures are declared here, each body one call into the face, rather than on the face: pytest computes a
test's fixture closure when it collects the test, so in a run that is not configured, fixtures that appeared
only when collection first met an llmserve test would be missing from the closures computed before (a test
using ``decode_check`` through a conftest fixture would lose its ``llm_server`` parametrization, and the node
ids of one run would differ with collection order). Declared here they cost a few fixture definitions, import
nothing, and ``pytest --fixtures`` lists them in every project that has the plugin installed, as
pytest-xdist's ``worker_id`` and pytest-benchmark's ``benchmark`` are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmserve.options import OPTIONS, Sources, may_hold_config

if TYPE_CHECKING:
    import openai

    from pytest_llmserve.bench_face import ABFace, BenchFace
    from pytest_llmserve.config import LLMServeConfig
    from pytest_llmserve.evidence.client import LLMClient
    from pytest_llmserve.face import LLMServeFace
    from pytest_llmserve.gates.decode import DecodeCheck
    from pytest_llmserve.server.handle import RunningServer

MARKERS = {
    # Registered only when the run is configured: a project's own gpu marker is the project's business.
    "gpu": "gpu: an llmserve test that needs a GPU (a server with gpu = true marks its tests); skipped with a "
           "reason where none is visible",
    "llmserve_server": "llmserve_server(*names): run this test once per configuration of the named server(s) "
                       "(matrix combinations included); '*' means every configured server",
    "llmserve_correctness": "llmserve_correctness: a decode-correctness oracle test "
                            "(select with -m llmserve_correctness)",
    "llmserve_after_traffic": "llmserve_after_traffic: runs after the other tests of its server configuration "
                              "(before its benchmarks): it reads what their requests left in the server's log",
    "llmserve_benchmark": "llmserve_benchmark(workload=None, *, metric=None, tolerance=None, rounds=None, "
                          "max_rounds=None, variable=None, higher_is_better=None, baseline_server=None, "
                          "baseline_test=None, warmup_rounds=None, warmup_agreement=None, extend_to_resolve=None, "
                          "extend_budget_s=None, contention_bound=None, between_run_sd=None): a throughput/latency "
                          "gate against the stored baseline (of another server/test when baseline_server/baseline_test "
                          "name one, e.g. 'test_llmserve_suite.py::test_throughput'); runs on one xdist worker only",
}
# What makes a collected item an llmserve item (the gpu marker alone only asks for the GPU probe).
LLMSERVE_MARKERS = ("llmserve_server", "llmserve_correctness", "llmserve_benchmark")
LLMSERVE_FIXTURES = frozenset({"llmserve_config", "llm_server", "llmserve_batch_case", "decode_check", "llm_client",
                               "llm_openai", "llm_async_openai", "llm_bench", "llm_ab"})

_INI_TYPES = {"flag": "bool", "string": "string", "int": "int", "float": "float"}

FACE_KEY = pytest.StashKey["LLMServeFace"]()  # the run's face, once registered (see _face)
FACE_NAME = "llmserve-face"  # its name in the plugin manager (pytest --trace-config lists it)


# ---------------------------------------------------------------------------- options and configuration

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmserve", "LLM inference server fixtures, correctness oracles and benchmark gates")
    for option in OPTIONS:
        if option.kind == "flag":
            group.addoption(option.flag, action="store_true", default=None, help=option.help)
        else:
            group.addoption(option.flag, default=None, help=option.help)
        parser.addini(option.ini, option.help, type=_INI_TYPES[option.kind], default=None)  # type: ignore[arg-type]


def _sources(config: pytest.Config) -> Sources:
    ini: dict[str, Any] = {}
    for option in OPTIONS:
        try:
            ini[option.name] = config.getini(option.ini)
        except (ValueError, TypeError, pytest.UsageError) as exc:  # a value of the wrong type
            raise pytest.UsageError(f"pytest-llmserve: ini {option.ini}: {exc}") from None
    return Sources(cli={option.name: config.getoption(option.flag) for option in OPTIONS}, ini=ini,
                   env=dict(os.environ))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, line in MARKERS.items():
        if name != "gpu":
            config.addinivalue_line("markers", line)
    sources = _sources(config)
    configured = False
    # The settings (and the modules they need) only where a setting or a configuration file may be.
    if any(sources.lookup(option) is not None for option in OPTIONS) or may_hold_config(Path(config.rootpath)):
        configured = _face_class().resolve_settings(config, sources).configured
    if configured:
        config.addinivalue_line("markers", MARKERS["gpu"])
    if configured or _is_xdist_controller(config):
        _face(config, sources, use=configured).configure(configured=configured)


def _is_xdist_controller(config: pytest.Config) -> bool:
    distributing = bool(getattr(config.option, "numprocesses", None)) or bool(getattr(config.option, "tx", None))
    return distributing and not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist")


def _face_class() -> type[LLMServeFace]:
    """The face's class, and with its module everything a run that uses llmserve needs."""
    # lazy: the package's one import outside module level; a run that does not use llmserve imports nothing of it
    # but this module and options.py (tests/plugin/test_inert.py)
    from pytest_llmserve.face import LLMServeFace

    return LLMServeFace


def _face(config: pytest.Config, sources: Sources | None = None, *, use: bool = True) -> LLMServeFace:
    """The run's face, made and registered by the first call; ``use``: the run uses llmserve from here on
    (its settings resolved, its run state made)."""
    face = config.stash.get(FACE_KEY, None)
    if face is None:
        face = config.stash[FACE_KEY] = _face_class()(config, sources or _sources(config))
        config.pluginmanager.register(face, FACE_NAME)
    if use:
        face.use()
    return face


# ---------------------------------------------------------------------------- collection: where a run starts to use it

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "llm_server" in metafunc.fixturenames:
        _face(metafunc.config).parametrize(metafunc)


def _is_llmserve_item(item: pytest.Item) -> bool:
    return (not LLMSERVE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(name) is not None for name in LLMSERVE_MARKERS))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    llmserve_items = [item for item in items if _is_llmserve_item(item)]
    if llmserve_items:  # else nothing of ours to check, mark, probe for or order (configured or not)
        _face(config).check_and_order(items, llmserve_items)


# ---------------------------------------------------------------------------- fixtures (their bodies: the face's)

@pytest.fixture(scope="session")
def llmserve_config(pytestconfig: pytest.Config) -> LLMServeConfig:
    """The loaded configuration (servers, matrices, workloads)."""
    return _face(pytestconfig).llmserve_config()


@pytest.fixture
def llm_server(request: pytest.FixtureRequest) -> RunningServer:
    """The running server for this test's configuration.

    Booted once per configuration per run and shared by every test (and xdist worker) that uses it.
    """
    return _face(request.config).llm_server(request)


@pytest.fixture
def decode_check(llm_server: RunningServer, request: pytest.FixtureRequest) -> DecodeCheck:
    """Decode oracles bound to this test's server: ``decode_check.no_nan().coherent()...``;
    ``decode_check.matches("other-server-id")`` boots that configuration beside this one as the reference."""
    return _face(request.config).decode_check(llm_server, request)


@pytest.fixture
def llm_client(llm_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[LLMClient]:
    """A :class:`pytest_llmserve.evidence.client.LLMClient` for this test's server."""
    yield from _face(request.config).llm_client(llm_server, request)


@pytest.fixture
def llm_openai(llm_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` client for this test's server (use ``llm_server.model_name`` as the model)."""
    yield from _face(request.config).llm_openai(llm_server)


@pytest.fixture
def llm_async_openai(llm_server: RunningServer, request: pytest.FixtureRequest) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` client for this test's server, for async tests (anyio, pytest-asyncio).

    Its connections belong to the test's event loop, which is gone at teardown: ``async with`` it, or
    ``await llm_async_openai.close()``, to close them there.
    """
    return _face(request.config).llm_async_openai(llm_server)


@pytest.fixture
def llm_bench(llm_server: RunningServer, request: pytest.FixtureRequest) -> BenchFace:
    """Benchmark gate bound to this test's server and its ``llmserve_benchmark`` marker: ``llm_bench.run()``."""
    return _face(request.config).llm_bench(llm_server, request)


@pytest.fixture
def llm_ab(request: pytest.FixtureRequest) -> ABFace:
    """A/B of two configured server configurations in one run: ``llm_ab.run(a="id", b="id")``.

    Both servers stay up; rounds are interleaved A B A B; fails when B regressed against A.
    """
    return _face(request.config).llm_ab(request)

"""Inert unless used: with the plugin installed but no llmserve configuration, setting, marker or fixture,
a run looks exactly as without it; and the core imports with pytest blocked."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins.helpers import server_toml, standin_argv

pytestmark = pytest.mark.filterwarnings("ignore")

# Records, from inside the inner run, every process it starts and its SIGTERM handler at import time
# (conftest.py is imported before the plugins' pytest_configure and before collection).
RECORDING_CONFTEST = """
import json
import os
import signal
import subprocess

SIGTERM_AT_START = signal.getsignal(signal.SIGTERM)
SPAWNED = []
_popen_init = subprocess.Popen.__init__


def _recording_init(self, args, *rest, **kwargs):
    SPAWNED.append([str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)])
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _recording_init


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    record = {"spawned": SPAWNED, "dist": getattr(session.config.option, "dist", None)}
    with open(os.environ["INERT_RECORD"], "w") as fh:
        json.dump(record, fh)
"""

PLAIN_TEST = """
import signal

import conftest


def test_plain(request):
    assert signal.getsignal(signal.SIGTERM) is conftest.SIGTERM_AT_START
    # On an xdist worker: whether the controller switched to loadgroup.
    assert not getattr(request.config.option, "loadgroup", False)


def test_other():
    pass
"""


@pytest.fixture
def plain_project(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with the plugin installed and no llmserve use; a recording nvidia-smi on PATH (the old
    GPU probe would have run it) and a private TMPDIR (where a run directory would appear)."""
    pytester.makeini("[pytest]\n")
    pytester.makefile(".toml", pyproject='[project]\nname = "plain"\n[tool.other]\nx = 1\n')
    pytester.makeconftest(RECORDING_CONFTEST)
    pytester.makepyfile(test_plain=PLAIN_TEST)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nprint('GPU 0: Fake (UUID: GPU-0)')\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setenv("INERT_RECORD", str(tmp_path / "record.json"))
    for name in list(os.environ):
        if name.startswith("PYTEST_LLMSERVE_"):
            monkeypatch.delenv(name)
    return temp


def test_a_project_without_llmserve_use_sees_no_change(pytester: pytest.Pytester, plain_project: Path,
                                                       tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    # Without the plugin: what pytest-benchmark (.benchmarks, `file -b`) and pytester (stdout...) do anyway.
    made_without, _ = _run_and_clean(pytester, "-p", "no:llmserve")
    spawned_without = json.loads(record.read_text())["spawned"]
    made, result = _run_and_clean(pytester)
    out = result.stdout.str() + result.stderr.str()
    assert not [line for line in out.splitlines() if line.startswith("llmserve") or "[llmserve]" in line], out
    assert made == made_without  # no results, baselines or run directory
    assert list(plain_project.iterdir()) == []  # nothing in the temporary directory either
    assert json.loads(record.read_text())["spawned"] == spawned_without  # no nvidia-smi, no process of ours


def _run_and_clean(pytester: pytest.Pytester, *args: str) -> tuple[set[str], pytest.RunResult]:
    """Run the plain project; return the names the run added to it (removed again) and the result."""
    before = {p.name for p in pytester.path.iterdir()}
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=2)
    made = {p.name for p in pytester.path.iterdir()} - before
    for name in made:
        path = pytester.path / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return made, result


def test_under_xdist_the_dist_mode_stays_load(pytester: pytest.Pytester, plain_project: Path,
                                              tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2)
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["dist"] == "load"
    assert not [argv for argv in record["spawned"] if "nvidia-smi" in " ".join(argv)]
    assert list(plain_project.iterdir()) == []


OWN_GPU_MARKER_CONFTEST = """
import pytest


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpu")
    if marker is not None and marker.kwargs.get("project_skips"):
        pytest.skip("the project's own gpu rule")
"""

OWN_GPU_TESTS = """
import pytest


@pytest.mark.gpu
def test_runs_on_the_projects_say():
    pass


@pytest.mark.gpu(project_skips=True)
def test_skipped_by_the_project():
    pass
"""


def test_a_projects_own_gpu_marker_keeps_its_behaviour(pytester: pytest.Pytester, plain_project: Path,
                                                        tmp_path: Path) -> None:
    """No GPU probe, no "no GPU visible" skip, and no second ``gpu`` marker of ours beside the project's."""
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the project's own GPU tests\n")
    pytester.makeconftest(RECORDING_CONFTEST + OWN_GPU_MARKER_CONFTEST)
    pytester.makepyfile(test_gpu=OWN_GPU_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers", "-rs", "test_gpu.py")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the project's own gpu rule*"])
    assert "GPU visible" not in result.stdout.str()
    assert not [argv for argv in json.loads((tmp_path / "record.json").read_text())["spawned"]
                if "nvidia-smi" in " ".join(argv)]
    markers = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--markers").stdout.str()
    assert [line for line in markers.splitlines() if line.startswith("@pytest.mark.gpu")] == [
        "@pytest.mark.gpu: the project's own GPU tests"]


# Run at the end of configuration (after pytest-xdist's and ours): what the controller would distribute with,
# and the scheduler it would make; then end the run before any gateway is opened (no ssh here).
XDIST_SETTINGS_CONFTEST = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    scheduler = config.hook.pytest_xdist_make_scheduler(config=config, log=None)
    print("XDIST", config.option.dist, config.option.maxworkerrestart, type(scheduler).__name__)
    pytest.exit("settings printed", returncode=0)
"""


@pytest.mark.parametrize("configured", [False, True], ids=["plain", "configured"])
def test_across_hosts_the_dist_settings_are_the_projects_own(pytester: pytest.Pytester, plain_project: Path,
                                                             configured: bool) -> None:
    """A remote gateway (``--tx ssh=...``): unconfigured, the dist mode, ``--max-worker-restart`` and the
    scheduler are pytest-xdist's; configured, ours (grouped by configuration), which shows the check can fail."""
    pytest.importorskip("xdist")
    pytester.makeconftest(XDIST_SETTINGS_CONFTEST)
    if configured:
        pytester.makefile(".toml", llmserve=server_toml("a", engine="external", url="http://127.0.0.1:9"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--tx", "ssh=nohost.invalid",
                                           "--dist", "load")
    expected = "XDIST loadgroup 0 ByConfigScheduling" if configured else "XDIST load None LoadScheduling"
    assert expected in result.stdout.str().splitlines(), result.stdout.str()


SYS_MODULES_TEST = """
import sys


def test_print_modules():
    print("MODULES", sorted(m for m in sys.modules if m.startswith("pytest_llmserve")
                            or m.split(".")[0] in ("httpx", "psutil", "filelock", "numpy", "openai", "tomllib")))
"""


def test_a_plain_run_imports_only_the_entry_module(pytester: pytest.Pytester, plain_project: Path) -> None:
    pytester.makepyfile(test_modules=SYS_MODULES_TEST)

    def imported(*args: str) -> set[str]:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "test_modules.py", *args)
        result.assert_outcomes(passed=1)
        line = next(line for line in result.stdout.lines if "MODULES [" in line)
        return set(ast.literal_eval(line.split("MODULES ", 1)[1].rstrip(".")))

    without = imported("-p", "no:llmserve")
    assert imported() - without == {"pytest_llmserve", "pytest_llmserve.options", "pytest_llmserve.plugin"}


def test_a_configured_gpu_server_still_skips_its_tests_without_a_gpu(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Configured and used, the probe runs for the server's items (gpu = true) and for llmserve items marked
    gpu; the project's own gpu tests are still its own."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makefile(".toml", llmserve=server_toml("g", engine="command", argv=standin_argv("silent.py"), gpu=True))
    pytester.makepyfile("""
        import pytest

        def test_on_the_server(llm_server):
            pass

        @pytest.mark.gpu
        def test_config_fixture(llmserve_config):
            pass

        @pytest.mark.gpu
        def test_the_projects_own():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*no GPU visible*"])


CORE_IMPORT_CHECK = """
import importlib
import pkgutil
import sys


class BlockPytest:
    def find_spec(self, name, path=None, target=None):
        if name in ("pytest", "_pytest") or name.startswith(("pytest.", "_pytest.")):
            raise ImportError(f"pytest is blocked here: {name}")
        return None


sys.meta_path.insert(0, BlockPytest())

import pytest_llmserve

assert "numpy" not in sys.modules, "import pytest_llmserve imported numpy"
pytest_llmserve.ServerSpec, pytest_llmserve.load_config, pytest_llmserve.ConfigError  # the lazy public API
assert "numpy" not in sys.modules

# The pytest face (plugin, face, session, collection, xdist and report hooks, the benchmark gates' face) and the
# built-in test files import pytest; nothing else may.
PYTEST_FACE = ("pytest_llmserve.plugin", "pytest_llmserve.face", "pytest_llmserve.session",
               "pytest_llmserve.collection", "pytest_llmserve.xdist_hooks", "pytest_llmserve.report_hooks",
               "pytest_llmserve.bench_face")
imported = []
for module in pkgutil.walk_packages(pytest_llmserve.__path__, "pytest_llmserve."):
    if module.name in PYTEST_FACE or module.name.startswith("pytest_llmserve.suite"):
        continue
    importlib.import_module(module.name)
    imported.append(module.name)
assert set(pytest_llmserve.__all__) == set(pytest_llmserve._MODULE_OF)
for name in pytest_llmserve.__all__:
    getattr(pytest_llmserve, name)
assert "pytest" not in sys.modules
print(len(imported), "modules")
"""


def test_the_core_imports_with_pytest_blocked() -> None:
    done = subprocess.run([sys.executable, "-c", CORE_IMPORT_CHECK], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) > 30

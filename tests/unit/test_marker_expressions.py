"""The commands the project documents select tests that exist: each ``pytest ... -m EXPR`` in tox.ini, README.md,
the docs and .ci/run names only markers that are registered (pyproject's ``markers``, the plugin's own) and carried
by at least one test under tests/, and each ``tox -e NAME`` names an environment of tox.ini.

``tox -e bench`` ran ``pytest tests -m bench`` for a marker no test carried: it selected nothing. The check is
shown failing on a planted unknown marker, on a registered marker no test carries and on an unknown environment,
beside its pass on the repository."""

from __future__ import annotations

import configparser
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_llmserve.plugin import MARKERS
from tests.unit.test_doc_references import PY_TEXT_RE

REPO = Path(__file__).resolve().parents[2]

# `pytest tests -m builds`, `pytest -m "builds and not gpu" tests`: the expression after -m.
SELECT_RE = re.compile(r"\bpytest\b[^\n`#;|]*?\s-m\s+(\"[^\"]*\"|'[^']*'|[\w]+)")
TOX_ENV_RE = re.compile(r"\btox\s+-e\s+([\w,-]+)")
MARK_RE = re.compile(r"\bpytest\.mark\.(\w+)")
# pytest's own markers: registered by pytest, carried or not.
BUILTIN_MARKERS = frozenset({"skip", "skipif", "xfail", "parametrize", "usefixtures", "filterwarnings"})


def command_files(root: Path) -> list[Path]:
    return [p for p in (root / "tox.ini", root / "README.md", root / ".ci" / "run", *sorted(root.glob("docs/*.md")))
            if p.is_file()]


def registered_markers(root: Path, plugin_markers: Iterable[str]) -> set[str]:
    ini = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    own = {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in ini.get("markers", [])}
    return own | set(plugin_markers) | BUILTIN_MARKERS


def carried_markers(root: Path) -> set[str]:
    """The markers a test under tests/ carries: ``pytest.mark.NAME`` in code, not in a string (a pytester run's
    inner test file) or a comment."""
    carried: set[str] = set()
    for path in (root / "tests").rglob("*.py"):
        code = PY_TEXT_RE.sub(" ", path.read_text(encoding="utf-8"))
        carried.update(MARK_RE.findall(code))
    return carried


def tox_environments(root: Path) -> set[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(root / "tox.ini", encoding="utf-8")
    envs = {section.removeprefix("testenv:") for section in parser.sections() if section.startswith("testenv:")}
    envlist = parser.get("tox", "envlist", fallback="")
    return envs | {name.strip() for name in envlist.split(",") if name.strip()}


def command_problems(root: Path, plugin_markers: Iterable[str]) -> list[str]:
    """What a documented command selects that is not there, one line each, naming the file and line."""
    registered = registered_markers(root, plugin_markers)
    carried = carried_markers(root)
    envs = tox_environments(root)
    problems: list[str] = []
    for path in command_files(root):
        where = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in SELECT_RE.finditer(line):
                expression = match.group(1).strip("\"'")
                for name in re.findall(r"[A-Za-z_]\w*", expression):
                    if name in {"and", "or", "not"}:
                        continue
                    if name not in registered:
                        problems.append(f"{where}:{number}: -m {expression}: marker {name!r} is not registered")
                    elif name not in carried and name not in BUILTIN_MARKERS:
                        problems.append(f"{where}:{number}: -m {expression}: no test under tests/ carries {name!r}")
            for match in TOX_ENV_RE.finditer(line):
                for env in match.group(1).split(","):
                    if env not in envs:
                        problems.append(f"{where}:{number}: tox -e {env}: tox.ini has no such environment")
    return problems


def test_every_documented_selection_selects_tests_that_exist() -> None:
    assert command_problems(REPO, MARKERS) == []


def test_the_bench_environment_selects_the_real_engine_benchmark_tests() -> None:
    assert "bench" in tox_environments(REPO)
    assert "pytest tests -m bench" in (REPO / "tox.ini").read_text(encoding="utf-8")
    assert {"bench", "builds", "multihost", "power", "slow", "gpu"} <= carried_markers(REPO)


# A small project: three registered markers, two carried by a test, one only inside a pytester string.
PYPROJECT = '''[tool.pytest.ini_options]
markers = ["bench: the real-engine benchmark tests", "slow: boots a server", "nightly(reason): only at night"]
'''
TEST_FILE = '''import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow]

INNER = """
@pytest.mark.nightly
def test_inner():
    pass
"""


def test_a():  # pytest.mark.nightly in a comment carries nothing
    pass
'''


def small_project(root: Path, tox_commands: str) -> Path:
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "tests").mkdir()
    (root / "tests" / "test_a.py").write_text(TEST_FILE)
    (root / "tox.ini").write_text(f"[tox]\nenvlist = py311\n\n[testenv:bench]\ncommands = {tox_commands}\n")
    (root / "README.md").write_text("# Project\n\n    tox -e bench  # or: pytest tests -m bench\n")
    return root


def test_a_project_whose_selections_exist_passes(tmp_path: Path) -> None:
    root = small_project(tmp_path, 'pytest tests -m "bench and not slow" {posargs}')
    assert command_problems(root, ["gpu"]) == []


@pytest.mark.parametrize(("command", "problem"), [
    ("pytest tests -m weekly {posargs}", "tox.ini:5: -m weekly: marker 'weekly' is not registered"),
    ("pytest tests -m nightly {posargs}", "tox.ini:5: -m nightly: no test under tests/ carries 'nightly'"),
    ("pytest -m 'bench or weekly' tests", "tox.ini:5: -m bench or weekly: marker 'weekly' is not registered"),
])
def test_a_planted_selection_of_nothing_is_named(tmp_path: Path, command: str, problem: str) -> None:
    assert command_problems(small_project(tmp_path, command), ["gpu"]) == [problem]


def test_a_planted_unknown_tox_environment_is_named(tmp_path: Path) -> None:
    root = small_project(tmp_path, "pytest tests -m bench")
    (root / "README.md").write_text("# Project\n\n    tox -e benchmarks\n")
    assert command_problems(root, ["gpu"]) == ["README.md:3: tox -e benchmarks: tox.ini has no such environment"]

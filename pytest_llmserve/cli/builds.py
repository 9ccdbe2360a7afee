"""``llmserve builds list|install|remove`` and ``llmserve builds compare A B``: engine builds as configuration.

The environments are made by :mod:`pytest_llmserve.builds`; compare and bisect run in
:mod:`pytest_llmserve.gates.builds`.
"""

from __future__ import annotations

import argparse
import sys

from pytest_llmserve.cli import bisect as cli_bisect
from pytest_llmserve.config import parse_builds


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("builds", help="engine builds: list, install, remove, compare two builds")
    bsub = p.add_subparsers(dest="builds_command", required=True)
    p_list = bsub.add_parser("list", help="the installed build environments")
    p_list.set_defaults(func=_list)
    p_install = bsub.add_parser("install", help="install builds now (otherwise they are installed on first use)")
    p_install.add_argument("builds", nargs="+", metavar="BUILD",
                           help="a pip requirement, a wheel/sdist, a source tree or python=PATH")
    p_install.set_defaults(func=_install)
    p_remove = bsub.add_parser("remove", help="remove installed build environments (by directory or build)")
    p_remove.add_argument("names", nargs="+", metavar="NAME")
    p_remove.set_defaults(func=_remove)

    cli_bisect.add_compare_parser(bsub)


def _list(args: argparse.Namespace) -> int:
    # lazy: the installer's modules (37 ms), which the other commands do not need
    from pytest_llmserve.builds import Installer

    inst = Installer()
    found = inst.installed()
    if not found:
        print(f"no build environments under {inst.root}")
        return 0
    for d, meta in found:
        print(f"{meta.get('resolved', '?'):32} engine {meta.get('version') or '?':10} "
              f"installed {meta.get('created_at', '?')} in {meta.get('install_seconds', '?')} s  {d}")
    return 0


def _install(args: argparse.Namespace) -> int:
    # lazy: the installer's modules (37 ms), which the other commands do not need
    from pytest_llmserve.builds import Installer

    specs = parse_builds(args.builds, source="llmserve builds install")
    inst = Installer()
    for spec in specs:
        env = inst.ensure(spec)
        print(f"{spec.label}: {env.python} (engine {env.version or 'unknown'}; "
              f"{'reused' if env.reused else f'installed in {env.seconds:.0f} s'})")
    return 0


def _remove(args: argparse.Namespace) -> int:
    # lazy: the installer's modules (37 ms), which the other commands do not need
    from pytest_llmserve.builds import Installer

    inst = Installer()
    status = 0
    for name in args.names:
        removed = inst.remove(name)
        if not removed:
            known = ", ".join(d.name for d, _ in inst.installed()) or "none"
            print(f"llmserve builds remove: no build environment {name!r} (installed: {known})", file=sys.stderr)
            status = 2
        for d in removed:
            print(f"removed {d}")
    return status

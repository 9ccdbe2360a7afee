"""The signals of issue 36's renovation of the benchmark path, measured the same way before and after.

    python tools/plumbing_signals.py [PACKAGE_DIR]

prints: ``Any`` as a word in the package's .py files (``grep -rwo Any | wc -l``); functions over radon complexity
10 and 20 (``radon cc -n C`` / ``-n D``, radon must be installed); ``__init__`` methods with more than 10
parameters; callback parameters in gates/ and load/ that report or end a run (annotated ``Callable`` and named
``say``, ``fail``, ``skip``, ``record``, ``confounded``, ``invalid`` or ``on_progress``: the callbacks the issue
counts; an injected clock or a judge function is a parameter, not a report).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPORTING = {"say", "fail", "skip", "record", "confounded", "invalid", "on_progress"}


def any_words(root: Path) -> int:
    return sum(len(re.findall(r"\bAny\b", p.read_text())) for p in root.rglob("*.py"))


def radon_over(root: Path, rank: str) -> int:
    out = subprocess.run([sys.executable, "-m", "radon", "cc", "-s", "-n", rank, str(root)],
                         capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if re.match(r"^    [FMC] ", line))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def functions(root: Path) -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((path, node))
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "pytest_llmserve")
    fns = functions(root)
    big_inits = [f"{p.relative_to(root)}:{fn.lineno} ({len(_params(fn)) - 1})" for p, fn in fns
                 if fn.name == "__init__" and len(_params(fn)) - 1 > 10]
    callbacks = [f"{p.relative_to(root)}:{fn.lineno} {fn.name}({arg.arg})" for p, fn in fns
                 if p.relative_to(root).parts[0] in ("gates", "load") for arg in _params(fn)
                 if arg.arg in REPORTING and arg.annotation is not None and "Callable" in ast.unparse(arg.annotation)]
    print(f"Any: {any_words(root)}")
    print(f"radon functions over 10: {radon_over(root, 'C')}, over 20: {radon_over(root, 'D')}")
    print(f"__init__ over 10 parameters: {len(big_inits)} {big_inits}")
    print(f"callback parameters in gates/ and load/: {len(callbacks)}")
    for line in callbacks:
        print(f"  {line}")


if __name__ == "__main__":
    main()

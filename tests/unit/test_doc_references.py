"""Every file, module, symbol and doc section that the docs and the code's docstrings and comments name exists.

A moved module leaves references behind: a path (``gates/context.py``,
``tests/unit/test_layers.py::test_imports_follow_the_layers``), a dotted module (``pytest_llmserve.verdicts.stats``),
a Sphinx role (``:func:`pytest_llmserve.gates.context.build_context```), a short ``module.symbol``
(``stats.decide_sequential``), a Markdown link with its anchor, or a doc's section by number or by title
(``docs/performance.md, section 10``, ``docs/performance.md, "Time to verdict"``). The check reads
README.md, the docs, and the comments, docstrings and doc-naming strings of every Python file, and resolves each
reference against the files on disk and the modules' text: a definition at a line's start, else the module's syntax
tree (``ast``), which decides every reference that does not resolve. Nothing is imported, so it is fast and runs on
any tree, a planted one included.

Left out on purpose: docs/changelog.md (history names things as they were when it happened) and the reports the
plugin wrote into docs/ (``summary*.md``, ``ab_summary.md``: output kept as it was printed).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "pytest_llmserve"

# Dangling references in files that another change of issue 36 is rewriting now (its brief lists each, with
# what it should say): (file, reference as written). Empty this once that change lands; an entry that no longer
# dangles fails the test, so the list cannot outlive its references.
KNOWN_DANGLING: frozenset[tuple[str, str]] = frozenset()

# This file: its docstrings and strings plant dangling references on purpose.
SELF = "tests/unit/test_doc_references.py"
# Documents the project names that live beside the repository, not in it: the design notes it was built from.
EXTERNAL_DOCS = frozenset({"DESIGN.md"})
# Folders that hold no text of the project's own.
SKIPPED_DIRS = frozenset({".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".tox",
                          "build", "dist", "llmserve-results", "reports", "node_modules"})
# What a path reference can end with: the kinds of file the project keeps.
EXTENSIONS = ("py", "md", "json", "toml", "sh", "in", "ini", "txt", "gz", "png", "csv", "yaml", "yml", "cfg")
# Roots of other projects' trees named in the docs (vLLM's, AIPerf's, guidellm's sources): not this tree.
FOREIGN_ROOTS = frozenset({"aiperf", "guidellm", "sglang", "vllm", "torch", "transformers", "site-packages"})
# First names that the docs and comments use for a value more than for the package module of that name: a pytest
# object (`config.stash`, `session.config`), a local (`facts.enforce_eager`, `rounds.append`, `json.dumps`,
# `handle.start()`), a context key (`hardware.cpu_flags`) or an engine's own package (`vllm.entrypoints`).
NOT_MODULES = frozenset({"config", "session", "settings", "server", "handle", "report", "facts", "rounds", "contention",
                         "json", "hardware", "vllm", "sglang", "llamacpp"})

_EXT = "|".join(EXTENSIONS)
# A path with at least one slash: `gates/context.py`, `README.md#configure-your-own-server`,
# `tests/unit/test_layers.py::test_imports_follow_the_layers`.
PATH_RE = re.compile(rf"(?<![\w/.~$<{{*@:\\-])((?:\.\.?/)*(?:[\w.-]+/)+[\w-][\w.-]*\.(?:{_EXT}))(?![\w/*{{<-])"
                     r"(#[\w-]+|::\w+(?:::\w+)?)?")
# A module's path without ".py", then a symbol: `gates/context.server_state`.
PATH_SYMBOL_RE = re.compile(r"(?<![\w/.~-])((?:[a-z_]+/)+[a-z_]\w*)\.([A-Za-z_]\w*)\b(?![/(])")
# A file named alone, in the docs: `bench.py`, `README.md`.
BARE_RE = re.compile(r"(?<![\w/.~$<{*@-])([\w-]+\.(?:py|md))(?![\w/*{<-])")
DOTTED_RE = re.compile(rf"(?<![\w.]){PACKAGE}(?:\.[A-Za-z_]\w*)+")
ROLE_RE = re.compile(r":(?:py:)?(?:func|class|mod|data|attr|meth|exc|obj|const):`~?([\w.]+?)(?:\(\))?`")
# `stats.decide_sequential`: the last name of a package module, then a symbol of it.
SHORT_RE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)\b(?![./])")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
# `docs/performance.md, section 10`, `performance.md section 9`, `docs/performance.md, sections 5 and 10`.
_NUMBERS = r"(\d+(?:(?:,\s*|\s+and\s+)\d+)*)"
SECTION_RE = re.compile(rf"([\w/.-]*\w\.md)[,:]?\s+\(?sections?\s+{_NUMBERS}")
OWN_SECTION_RE = re.compile(rf"(?<!\.md, )(?<!\.md )\bsections?\s+{_NUMBERS}")
# `docs/performance.md, "Time to verdict"`, `docs/performance.md 'Between runs'`, `docs/testing.md ("Groups")`.
TITLE_RE = re.compile(r"([\w/.-]*\w\.md)[,:]?\s+\(?(?:\"([^\"\n]+)\"|'([^'\n]+)'|“([^”\n]+)”)")
URL_RE = re.compile(r"\b[a-z]+://\S+")
# A module's text read without parsing: a definition or import at a line's start (a top-level name), a class's
# body (up to the next line at column 0) and what it defines: methods and attributes at 4 spaces, self.x = ...
TOP_LEVEL_RE = re.compile(r"^(?:(?:async\s+)?def|class)\s+(\w+)|^(\w+)\s*(?::|=(?!=))"
                          r"|^(?:from\s+\S+\s+)?import\s+(\([^)]*\)|[^\n]*)", re.MULTILINE)
CLASS_RE = re.compile(r"^class (\w+)\b.*?(?=^\S|\Z)", re.MULTILINE | re.DOTALL)
MEMBER_RE = re.compile(r"^    (?:(?:async\s+)?def\s+(\w+)|(\w+)\s*(?::|=(?!=)))|\bself\.(\w+)\s*(?::[^=\n]+)?=(?!=)",
                       re.MULTILINE)
# A Python source's string literals and comments, in one pass (the texts a reference can be in).
PY_TEXT_RE = re.compile(r"""(?P<string>[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''"""
                        r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))|(?P<comment>\#[^\n]*)""")


@dataclass(frozen=True, slots=True, order=True)
class Dangling:
    """One reference that names nothing: where it is, what it says, and why it does not resolve."""

    where: str  # "docs/performance.md:12"
    reference: str
    problem: str

    @property
    def file(self) -> str:
        return self.where.rsplit(":", 1)[0]

    def __str__(self) -> str:
        return f"{self.where}: {self.reference!r}: {self.problem}"


@dataclass(frozen=True, slots=True)
class Text:
    """A piece of prose to check: its file (relative to the tree, and the folder it is read from), the line it
    starts on, and the Python module it is in, if any."""

    rel: str
    base: Path
    line: int
    text: str
    module: str | None = None

    @property
    def is_doc(self) -> bool:
        return self.rel.endswith(".md")


class Tree:
    """One repository on disk: its files, its Python modules' names, its docs' headings; each read once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = [p.relative_to(root).as_posix() for p in _walk(root)]
        self.paths = frozenset(self.files)
        # Every tail of every path ("e2e/test_faults.py" of "tests/e2e/test_faults.py"), to its path.
        self.tails: dict[str, str] = {}
        for p in self.files:
            parts = p.split("/")
            for i in range(1, len(parts)):
                self.tails.setdefault("/".join(parts[i:]), p)
        self.basenames = frozenset(p.rsplit("/", 1)[-1] for p in self.files)
        self.folder_names = frozenset(p.rsplit("/", 1)[-1] for p in self.files if (root / p).is_dir())
        self.module_stems: dict[str, list[str]] = {}
        for p in self.files:
            if p.startswith(f"{PACKAGE}/") and p.endswith(".py"):
                dotted = p[:-3].replace("/", ".").removesuffix(".__init__")
                self.module_stems.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
        self._sources: dict[Path, str] = {}
        self._quick_names: dict[Path, tuple[set[str], dict[str, set[str]]]] = {}
        self._names: dict[Path, dict[str, ast.AST]] = {}
        self._members: dict[int, set[str]] = {}
        self._headings: dict[str, list[str]] = {}

    def resolve_path(self, ref: str, base: Path) -> str | None:
        """The tree's file or folder a path names: from the referencing file's folder, the root or the package,
        or as the tail of a path in the tree (``e2e/test_faults.py``); None when there is none."""
        ref = ref.removeprefix("./").rstrip("/")
        for start in (base, self.root, self.root / PACKAGE):
            candidate = (start / ref).resolve()
            if candidate.is_relative_to(self.root) and candidate.exists():
                return candidate.relative_to(self.root).as_posix()
        return None if ".." in ref else self.tails.get(ref)

    def module_file(self, dotted: str) -> Path | None:
        path = self.root.joinpath(*dotted.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def source(self, module_file: Path) -> str:
        if module_file not in self._sources:
            self._sources[module_file] = module_file.read_text(encoding="utf-8")
        return self._sources[module_file]

    def names(self, module_file: Path) -> dict[str, ast.AST]:
        """What a module defines or imports at its top level (and its submodules, for a package)."""
        if module_file not in self._names:
            tree = ast.parse(self.source(module_file), filename=str(module_file))
            self._names[module_file] = _top_level_names(module_file, tree)
        return self._names[module_file]

    def defines(self, module_file: Path, name: str) -> bool:
        """Whether a module has ``name`` at its top level. A definition or import at a line's start is one (the
        quick look, which most references pass); else the syntax tree decides (names in an ``if`` or ``try``, a
        package's submodules), so a reference that does not resolve is always judged by the tree."""
        if _is_dunder(name) or name in self.quick_names(module_file)[0]:
            return True
        return name in self.names(module_file)

    def class_has(self, module_file: Path, class_name: str, member: str) -> bool:
        """Whether a class of the module has ``member`` (a method, a class attribute or field, an attribute a
        method sets on self): its body read first, the syntax tree where that finds nothing."""
        top, classes = self.quick_names(module_file)
        if _is_dunder(member) or member in classes.get(class_name, set()):
            return True
        if class_name in top and class_name not in classes:
            return True  # an imported name or a function: what is below it is not this module's to check
        node = self.names(module_file).get(class_name)
        return not isinstance(node, ast.ClassDef) or member in self.members(node)

    def any_class_has(self, module_file: Path, member: str) -> bool:
        """A relative role in a class's docstring (a method of ``Accounting`` in its own) names a member of that
        class: accepted when any class of the module has it."""
        if any(member in members for members in self.quick_names(module_file)[1].values()):
            return True
        return any(isinstance(node, ast.ClassDef) and member in self.members(node)
                   for node in self.names(module_file).values())

    def quick_names(self, module_file: Path) -> tuple[set[str], dict[str, set[str]]]:
        """The names a module's text defines at a line's start, and its classes' members, read without parsing."""
        if module_file not in self._quick_names:
            source = self.source(module_file)
            top: set[str] = set()
            for match in TOP_LEVEL_RE.finditer(source):
                if match.group(3) is not None:  # an import: its bound names
                    top.update(_bound_names(match.group(3)))
                else:
                    top.add(match.group(1) or match.group(2))
            classes = {match.group(1): {next(g for g in m.groups() if g) for m in MEMBER_RE.finditer(match.group(0))}
                       for match in CLASS_RE.finditer(source)}
            self._quick_names[module_file] = (top, classes)
        return self._quick_names[module_file]

    def members(self, node: ast.ClassDef) -> set[str]:
        if id(node) not in self._members:
            self._members[id(node)] = _class_members(node)
        return self._members[id(node)]

    def resolve_dotted(self, dotted: str) -> str | None:
        """None when a dotted name (``pytest_llmserve.verdicts.comparability.Comparability.host_diffs``) is a module
        and, below it, a symbol of it and a member of that; else why not."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module_file = self.module_file(".".join(parts[:cut]))
            if module_file is not None:
                return self.resolve_symbols(module_file, parts[cut:], ".".join(parts[:cut]))
        return f"no module {parts[0]}"

    def resolve_symbols(self, module_file: Path, rest: list[str], module: str) -> str | None:
        if not rest:
            return None
        if not self.defines(module_file, rest[0]):
            return f"{module} has no {rest[0]}"
        if len(rest) > 1 and not self.class_has(module_file, rest[0], rest[1]):
            return f"{module}.{rest[0]} has no {rest[1]}"
        return None

    def headings(self, md_file: str) -> list[str]:
        if md_file not in self._headings:
            in_code = False
            found: list[str] = []
            for line in (self.root / md_file).read_text(encoding="utf-8").splitlines():
                if line.startswith("```"):
                    in_code = not in_code
                elif not in_code and line.startswith("#"):
                    found.append(line.lstrip("#").strip())
            self._headings[md_file] = found
        return self._headings[md_file]

    def anchors(self, md_file: str) -> set[str]:
        return {_slug(h) for h in self.headings(md_file)}

    def numbered_sections(self, md_file: str) -> set[str]:
        return {h.split(".", 1)[0] for h in self.headings(md_file) if re.match(r"\d+\. ", h)}


def _walk(root: Path) -> Iterator[Path]:
    for child in sorted(root.iterdir()):
        if child.name in SKIPPED_DIRS or child.name.endswith(".egg-info"):
            continue
        yield child
        if child.is_dir() and not child.is_symlink():
            yield from _walk(child)


def _top_level_names(module_file: Path, tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        for name, defined in _defined(node):
            names.setdefault(name, defined)
    if module_file.name == "__init__.py":
        for child in module_file.parent.iterdir():
            if child.suffix == ".py" or (child / "__init__.py").is_file():
                names.setdefault(child.stem, tree)
    return names


def _defined(node: ast.stmt) -> Iterator[tuple[str, ast.AST]]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name, node
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    yield name.id, node
    elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        yield node.target.id, node
    elif isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0], node
    elif isinstance(node, ast.If | ast.Try):
        handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
        for child in [*node.body, *node.orelse, *getattr(node, "finalbody", []), *handlers]:
            yield from _defined(child)


def _class_members(node: ast.ClassDef) -> set[str]:
    members = {name for stmt in node.body for name, _ in _defined(stmt)}
    for method in node.body:  # attributes a method sets on self
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(method):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    members.add(sub.attr)
    return members


def _bound_names(imported: str) -> Iterator[str]:
    """The names an import binds: ``a.b`` binds ``a``, ``x as y`` binds ``y``."""
    for item in re.sub(r"#[^\n]*", "", imported).replace("(", " ").replace(")", " ").split(","):
        words = item.split()
        if words:
            yield (words[-1] if len(words) == 3 and words[1] == "as" else words[0]).split(".")[0]


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


# ------------------------------------------------------------------------------------------------- the texts

def text_files(tree: Tree) -> list[str]:
    """README.md and the docs (not the changelog, not the plugin's recorded reports), and every Python file."""
    def read(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if rel.endswith(".md"):
            return rel != "docs/changelog.md" and not name.startswith("summary") and name != "ab_summary.md"
        return rel.endswith(".py") and rel != SELF
    return [rel for rel in tree.files if read(rel)]


def texts(tree: Tree) -> Iterator[Text]:
    """The docs whole; of every Python file its comments, its triple-quoted strings (docstrings) and the strings
    that name a doc (messages)."""
    for rel in text_files(tree):
        path = tree.root / rel
        if rel.endswith(".md"):
            yield Text(rel, path.parent, 1, path.read_text(encoding="utf-8"))
        else:
            yield from _python_texts(path, rel)


def _python_texts(path: Path, rel: str) -> Iterator[Text]:
    module = rel[:-3].replace("/", ".").removesuffix(".__init__")
    source = path.read_text(encoding="utf-8")
    line_starts = [0] + [m.end() for m in re.finditer("\n", source)]
    for match in PY_TEXT_RE.finditer(source):
        text = match.group(0)
        if match.group("string") is not None and '"""' not in text[:5] and "'''" not in text[:5] \
                and ".md" not in text:
            continue  # a one-line string: code's own value (a name, a pattern, an inner test file), not prose
        yield Text(rel, path.parent, bisect.bisect_right(line_starts, match.start()), text, module)


# ------------------------------------------------------------------------------------------------- the check

def dangling_references(tree: Tree) -> list[Dangling]:
    found: set[Dangling] = set()
    for text in texts(tree):
        in_code = False
        for offset, line in enumerate(text.text.splitlines()):
            if text.is_doc and line.startswith("```"):
                in_code = not in_code
            if "://" in line:
                line = URL_RE.sub(" ", line)
            for problem, ref in _check_line(tree, line, text, text.is_doc and not in_code):
                found.add(Dangling(f"{text.rel}:{text.line + offset}", ref, problem))
    return sorted(found)


def _check_line(tree: Tree, line: str, text: Text, prose: bool) -> Iterator[tuple[str, str]]:
    """The references of one line; ``prose``: a doc's line outside a code block, where Markdown links are."""
    base, rel, is_doc = text.base, text.rel, text.is_doc
    if "/" in line:
        for match in PATH_RE.finditer(line):
            if not _foreign(line[:match.start()]):
                yield from _path_reference(tree, match.group(1), match.group(2) or "", base)
        for match in PATH_SYMBOL_RE.finditer(line):
            yield from _path_symbol_reference(tree, match.group(1), match.group(2))
    if is_doc and (".md" in line or ".py" in line):
        for match in BARE_RE.finditer(line):
            name = match.group(1)
            if name not in tree.basenames and name not in EXTERNAL_DOCS and not _placeholder(name):
                yield "no file of this name in the repository", name
    roles = list(ROLE_RE.finditer(line)) if ":`" in line else []
    for match in roles:
        why = _resolve_role(tree, match.group(1), text.module)
        if why:
            yield why, match.group(0)
    if PACKAGE in line:
        for match in DOTTED_RE.finditer(line):
            why = None if any(r.start() < match.start() < r.end() for r in roles) else tree.resolve_dotted(match.group(0))
            if why:
                yield why, match.group(0)
    for match in SHORT_RE.finditer(line):
        yield from _short_reference(tree, match.group(1), match.group(2))
    if "section" in line or ".md" in line:
        yield from _section_references(tree, line, base, rel if is_doc else None)
    if prose and "](" in line:
        for match in LINK_RE.finditer(line):
            yield from _link_reference(tree, match.group(1), base, rel)


def _foreign(before: str) -> bool:
    """A path right after another project's name (``vLLM's tests/models/utils.py``) is in that project's tree."""
    return re.search(r"(?:vLLM|SGLang|AIPerf|guidellm|llama\.cpp)'s\s+[`(]*$", before) is not None


def _placeholder(ref: str) -> bool:
    """An example's made-up name (``tests/test_x.py::test_y``, ``test_x.py``)."""
    return re.search(r"(?:^|[/_.])(?:x|y|foo|bar)(?=[/_.:]|$)", ref) is not None


def _path_reference(tree: Tree, ref: str, suffix: str, base: Path) -> Iterator[tuple[str, str]]:
    first = ref.lstrip("./").split("/", 1)[0]
    if first in FOREIGN_ROOTS or (first not in tree.folder_names and not ref.startswith("..")) \
            or _placeholder(ref + suffix):
        return  # not a path into this tree
    resolved = tree.resolve_path(ref, base)
    if resolved is None:
        yield "no such file", ref + suffix
    elif suffix.startswith("#") and resolved.endswith(".md") and suffix[1:] not in tree.anchors(resolved):
        yield f"{resolved} has no heading with anchor {suffix}", ref + suffix
    elif suffix.startswith("::") and resolved.endswith(".py"):
        symbol = suffix[2:].split("::")[0]
        if not tree.defines(tree.root / resolved, symbol):
            yield f"{resolved} has no {symbol}", ref + suffix


def _path_symbol_reference(tree: Tree, folder: str, symbol: str) -> Iterator[tuple[str, str]]:
    if symbol in EXTENSIONS or folder.split("/", 1)[0] not in tree.module_stems:
        return
    module_file = tree.resolve_path(folder + ".py", tree.root / PACKAGE)
    if module_file is None:
        if tree.resolve_path(folder, tree.root / PACKAGE) is None:
            yield "no such module", f"{folder}.{symbol}"
    elif not tree.defines(tree.root / module_file, symbol):
        yield f"{module_file} has no {symbol}", f"{folder}.{symbol}"


def _link_reference(tree: Tree, target: str, base: Path, rel: str) -> Iterator[tuple[str, str]]:
    if re.match(r"[a-z]+:", target):
        return
    file_part, _, anchor = target.partition("#")
    resolved = tree.resolve_path(file_part, base) if file_part else rel
    if resolved is None:
        yield "no such file", target
    elif anchor and resolved.endswith(".md") and anchor not in tree.anchors(resolved):
        yield f"{resolved} has no heading with anchor #{anchor}", target


def _short_reference(tree: Tree, stem: str, symbol: str) -> Iterator[tuple[str, str]]:
    candidates = tree.module_stems.get(stem)
    if not candidates or stem in NOT_MODULES or stem == PACKAGE or symbol in EXTENSIONS or _is_dunder(symbol):
        return  # the package's own dotted names are checked whole
    for dotted in candidates:
        module_file = tree.module_file(dotted)
        if module_file is not None and tree.defines(module_file, symbol):
            return
    yield f"{' / '.join(candidates)} has no {symbol}", f"{stem}.{symbol}"


def _resolve_role(tree: Tree, target: str, module: str | None) -> str | None:
    if target.startswith(f"{PACKAGE}."):
        return tree.resolve_dotted(target)
    first = target.split(".")[0]
    module_file = tree.module_file(module) if module else None
    if module_file is not None:
        top, classes = tree.quick_names(module_file)
        in_a_class = "." not in target and any(first in members for members in classes.values())
        if first not in top and (in_a_class or "." not in target and tree.any_class_has(module_file, first)):
            return None  # a member of the class whose docstring it is in
        if tree.defines(module_file, first):
            return tree.resolve_symbols(module_file, target.split("."), module or "")
    if tree.resolve_dotted(f"{PACKAGE}.{target}") is None:
        return None
    if hasattr(builtins, first) or importlib.util.find_spec(first) is not None:
        return None  # the standard library's or a dependency's (`dict`, `asyncio.run`)
    return f"{target} is not defined in {module or 'the package'}"


def _section_references(tree: Tree, line: str, base: Path, own_md: str | None) -> Iterator[tuple[str, str]]:
    """``X.md, section N`` needs a heading "N. ..." in X.md; ``X.md, "Title"`` a heading containing the title;
    a bare "section N" in a doc whose sections are numbered, its own heading N."""
    for match in SECTION_RE.finditer(line):
        doc = _find_doc(tree, match.group(1), base)
        for number in re.findall(r"\d+", match.group(2)):
            if doc is not None and number not in tree.numbered_sections(doc):
                yield f"{doc} has no section {number}", match.group(0)
    for match in TITLE_RE.finditer(line):
        doc = _find_doc(tree, match.group(1), base)
        title = next(g for g in match.groups()[1:] if g)
        if doc is not None and not any(title.lower() in h.lower() for h in tree.headings(doc)):
            yield f"{doc} has no heading {title!r}", match.group(0)
    if own_md is not None and tree.numbered_sections(own_md):
        for match in OWN_SECTION_RE.finditer(line):
            for number in re.findall(r"\d+", match.group(1)):
                if number not in tree.numbered_sections(own_md):
                    yield f"{own_md} has no section {number}", match.group(0)


def _find_doc(tree: Tree, name: str, base: Path) -> str | None:
    if "/" in name:
        return tree.resolve_path(name, base)
    return next((c for c in (f"docs/{name}", name) if c in tree.paths), None)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


# ------------------------------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def repo_dangling() -> list[Dangling]:
    return dangling_references(Tree(REPO))


def test_every_reference_in_the_docs_and_the_code_resolves(repo_dangling: list[Dangling]) -> None:
    found = repo_dangling
    unexpected = [d for d in found if (d.file, d.reference) not in KNOWN_DANGLING]
    assert not unexpected, "dangling references:\n" + "\n".join(map(str, unexpected))
    gone = KNOWN_DANGLING - {(d.file, d.reference) for d in found}
    assert not gone, f"no longer dangling, drop them from KNOWN_DANGLING: {sorted(gone)}"


def test_the_check_reads_the_docs_and_the_code() -> None:
    """The pass above means something only if the texts it reads are the project's: README, docs, the package's
    docstrings and comments, the tests' and the scripts'."""
    read = set(text_files(Tree(REPO)))
    assert {"README.md", "docs/performance.md", "docs/testing.md", "docs/architecture.md",
            "pytest_llmserve/verdicts/stats.py", "pytest_llmserve/engines/base.py", "benchmarks/peers.py",
            "tests/conftest.py"} <= read
    assert "docs/changelog.md" not in read


# A small tree with one reference of each kind that resolves, then each kind planted dangling, one at a time.
SMALL_MODULE = '''"""The benchmark's context. See :func:`build_context` and :class:`Context`, :meth:`Context.diff`."""

try:  # a name the quick look misses and the syntax tree finds
    import tomllib
except ImportError:
    tomllib = None


def build_context() -> dict[str, str]:
    return {}


class Context:
    name: str = ""

    def diff(self) -> None:
        self.seen = True  # see docs/performance.md, section 1
'''
SMALL_DOC = '''# Performance

## 1. Targets

The context is built in `gates/context.py` (`gates/context.build_context`, `context.Context`, `context.tomllib`,
`pytest_llmserve.gates.context.Context.seen`), tested by `tests/test_context.py::test_built`; see
[the targets](#1-targets), docs/performance.md, section 1, and docs/performance.md, "Targets".
'''


def small_tree(root: Path) -> Tree:
    (root / "pytest_llmserve" / "gates").mkdir(parents=True)
    (root / "pytest_llmserve" / "__init__.py").write_text('"""The package."""\n')
    (root / "pytest_llmserve" / "gates" / "__init__.py").write_text("")
    (root / "pytest_llmserve" / "gates" / "context.py").write_text(SMALL_MODULE)
    (root / "tests").mkdir()
    (root / "tests" / "test_context.py").write_text("def test_built() -> None:\n    pass\n")
    (root / "docs").mkdir()
    (root / "docs" / "performance.md").write_text(SMALL_DOC)
    (root / "README.md").write_text("# Tree\n\nThe map: [performance](docs/performance.md#1-targets).\n")
    return Tree(root)


def test_a_tree_whose_references_all_resolve_passes(tmp_path: Path) -> None:
    assert dangling_references(small_tree(tmp_path)) == []


@pytest.mark.parametrize(("planted", "reference", "problem"), [
    ("the gate is in `gates/moved.py`", "gates/moved.py", "no such file"),
    ("tested by `tests/test_context.py::test_gone`", "tests/test_context.py::test_gone", "has no test_gone"),
    ("[targets](docs/performance.md#2-results)", "docs/performance.md#2-results", "no heading with anchor"),
    ("pytest_llmserve.gates.context.read_state reads it", "pytest_llmserve.gates.context.read_state",
     "pytest_llmserve.gates.context has no read_state"),
    ("pytest_llmserve.evidence.environment builds it", "pytest_llmserve.evidence.environment", "has no evidence"),
    ("`pytest_llmserve.gates.context.Context.gone`", "pytest_llmserve.gates.context.Context.gone",
     "Context has no gone"),
    ("see :func:`pytest_llmserve.gates.context.read_state`", ":func:`pytest_llmserve.gates.context.read_state`",
     "has no read_state"),
    ("`context.read_state` reads it", "context.read_state", "has no read_state"),
    ("`gates/context.read_state` reads it", "gates/context.read_state", "has no read_state"),
    ("the load generator (`load.py`)", "load.py", "no file of this name"),
    ("measured in docs/performance.md, section 10", "docs/performance.md, section 10", "has no section 10"),
    ('see docs/performance.md, "Between runs"', 'docs/performance.md, "Between runs"', "has no heading"),
    ("[statistics](docs/statistics.md)", "docs/statistics.md", "no such file"),
])
def test_a_planted_dangling_reference_in_the_docs_is_named(tmp_path: Path, planted: str, reference: str,
                                                           problem: str) -> None:
    tree = small_tree(tmp_path)
    (tmp_path / "README.md").write_text(f"# Tree\n\nThe map.\n\n{planted}.\n")
    found = dangling_references(tree)
    assert [(d.where, d.reference) for d in found] == [("README.md:5", reference)], found
    assert problem in found[0].problem


@pytest.mark.parametrize(("planted", "reference"), [
    ("# built as docs/context.md says", "docs/context.md"),
    ("# measured in docs/performance.md, section 7", "docs/performance.md, section 7"),
    ('"""Read by :meth:`Context.gone`."""', ":meth:`Context.gone`"),
    ('"""Read by :func:`read_state`."""', ":func:`read_state`"),
])
def test_a_planted_dangling_reference_in_a_comment_or_docstring_is_named(tmp_path: Path, planted: str,
                                                                        reference: str) -> None:
    tree = small_tree(tmp_path)
    module = tmp_path / "pytest_llmserve" / "gates" / "context.py"
    module.write_text(SMALL_MODULE + f"\n\ndef later() -> None:\n    {planted}\n    pass\n")
    found = dangling_references(tree)
    line = SMALL_MODULE.count("\n") + 4
    assert [(d.where, d.reference) for d in found] == [(f"pytest_llmserve/gates/context.py:{line}", reference)], found

"""A model's weights identified by their bytes: the sha256 of its safetensors, hashed once per file version.

The tiny-checkpoint builder (:mod:`pytest_llmserve.testing.dsa_checkpoint`) writes one ``model.safetensors`` and
records, under :data:`SHA_KEY` in its marker (``llmserve-checkpoint.json``), the sha256 of that file's bytes as
written (header and data). :func:`file_sha256` is that digest read back from disk, the one definition every reader
uses: the configuration checks a marker against it before taking a model as untrained
(:func:`pytest_llmserve.config.untrained`), and recorded reference answers name the model by the same key.

Hashing costs time in proportion to the bytes (SmolLM2's 269 MB: 0.15 s from a warm page cache, measured with
``hashlib.file_digest`` three times on the 2-core host of 2026-12-05; a production model holds over a thousand times
as many), so a digest is kept in a small JSON file under the plugin's cache directory, keyed by the file's absolute
path, size and ``st_mtime_ns``: a second call, a second process or a second run reads it back; a file whose size or
mtime changed is hashed again. Nothing is kept in memory: every call reads the file, so processes share it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_llmserve.json_encoding import dumps

#: The marker's key (``llmserve-checkpoint.json``) that holds the sha256 of the model folder's
#: :data:`WEIGHTS_FILE`; recorded reference answers use the same key for the model they were recorded on.
SHA_KEY = "model_safetensors_sha256"
#: The one weights file the builder writes and hashes.
WEIGHTS_FILE = "model.safetensors"
#: The digest cache's file name under the plugin's cache directory (``config.cache_dir()``).
DIGEST_CACHE_FILE = "weights-sha256.json"
_CACHE_SCHEMA = 1


def file_sha256(path: Path) -> str:
    """The sha256 of ``path``'s bytes (hex), read in chunks: what the builder records under :data:`SHA_KEY`."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def safetensors_files(folder: Path) -> tuple[Path, ...]:
    """Every ``*.safetensors`` file of a model folder, sorted by name (what an engine would load)."""
    return tuple(sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors") and p.is_file()))


@dataclass(frozen=True, slots=True)
class FileVersion:
    """One version of a file as the cache knows it: its size and modification time, and its digest."""

    size: int
    mtime_ns: int
    sha256: str

    def same_file(self, stat: os.stat_result) -> bool:
        return (self.size, self.mtime_ns) == (stat.st_size, stat.st_mtime_ns)

    def to_dict(self) -> dict[str, object]:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, value: object) -> FileVersion | None:
        """An entry read back, or None when it is not one this code wrote (then it is dropped)."""
        if not isinstance(value, dict):
            return None
        size, mtime_ns, sha256 = value.get("size"), value.get("mtime_ns"), value.get("sha256")
        if not (type(size) is int and type(mtime_ns) is int and isinstance(sha256, str) and len(sha256) == 64):
            return None
        return cls(size, mtime_ns, sha256)


def cached_sha256(path: Path, cache_file: Path) -> str:
    """:func:`file_sha256` of ``path``, read from ``cache_file`` when the file's size and mtime are those recorded
    for its absolute path, else hashed and recorded there. An unreadable or corrupt cache is ignored (and
    rewritten); an unwritable one costs only a second hashing next time, never a wrong digest."""
    target = path.resolve()  # a symlinked weights file (a hub cache's snapshot) is keyed by the file it names
    before = target.stat()
    known = read_digest_cache(cache_file).get(str(target))
    if known is not None and known.same_file(before):
        return known.sha256
    digest = file_sha256(target)
    after = target.stat()
    # A file written while it was read has a digest of neither version: returned, never recorded.
    if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
        _remember(cache_file, str(target), FileVersion(after.st_size, after.st_mtime_ns, digest))
    return digest


def read_digest_cache(cache_file: Path) -> dict[str, FileVersion]:
    """The cache's entries by absolute path; {} for a missing, unreadable or corrupt file (hashing again is
    the worst a bad cache may cost)."""
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != _CACHE_SCHEMA or not isinstance(data.get("files"), dict):
        return {}
    entries = {}
    for key, value in data["files"].items():
        entry = FileVersion.from_dict(value)
        if entry is not None:
            entries[str(key)] = entry
    return entries


def _remember(cache_file: Path, key: str, entry: FileVersion) -> None:
    """Add one entry: the file re-read just before (another process may have added its own), entries of files
    that are gone or changed dropped (the cache stays the size of the weights in use), written atomically.

    No lock: two processes writing at once each replace the file whole, so one entry may be lost, which costs a
    hashing later and never a wrong answer (each entry is checked against the file's size and mtime)."""
    entries = {path: known for path, known in read_digest_cache(cache_file).items() if _still_there(path, known)}
    entries[key] = entry
    text = dumps({"schema": _CACHE_SCHEMA, "files": {k: v.to_dict() for k, v in sorted(entries.items())}},
                      indent=1) + "\n"
    with contextlib.suppress(OSError):  # a read-only cache directory: the digest is still right, only not kept
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=f".{cache_file.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, cache_file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _still_there(path: str, known: FileVersion) -> bool:
    try:
        return known.same_file(os.stat(path))
    except OSError:
        return False

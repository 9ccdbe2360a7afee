"""The weights' sha256 (:mod:`pytest_llmserve.weights`): the builder's definition (the bytes of model.safetensors),
hashed once per file version and kept in a JSON file keyed by absolute path, size and mtime: a second call or a
second process does not read the weights again, a changed file is hashed again, a corrupt or unwritable cache
never breaks the answer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmserve import weights
from pytest_llmserve.testing.checkpoints import write_safetensors


def _weights(folder: Path, fill: int = 1, count: int = 64) -> Path:
    """A tiny safetensors file: one BF16 tensor of ``count`` elements, every byte ``fill``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / weights.WEIGHTS_FILE
    write_safetensors(path, {"w": ("BF16", [count], bytes([fill]) * (2 * count))})
    return path


def _bump_mtime(path: Path, seconds: int = 5) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


def test_the_digest_is_the_sha256_of_the_files_bytes(tmp_path: Path) -> None:
    path = _weights(tmp_path / "m")
    assert weights.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    other = _weights(tmp_path / "other", fill=2)
    assert weights.file_sha256(other) != weights.file_sha256(path)


def test_a_second_call_reads_the_cache_not_the_weights(tmp_path: Path, hashings: list[Path]) -> None:
    path = _weights(tmp_path / "m")
    cache = tmp_path / "cache" / weights.DIGEST_CACHE_FILE
    first = weights.cached_sha256(path, cache)
    assert hashings == [path.resolve()] and first == hashlib.sha256(path.read_bytes()).hexdigest()
    st = path.stat()
    assert json.loads(cache.read_text())["files"] == {
        str(path.resolve()): {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": first}}
    assert weights.cached_sha256(path, cache) == first
    assert hashings == [path.resolve()]  # not read again


def test_a_second_process_reads_the_cache(tmp_path: Path) -> None:
    path = _weights(tmp_path / "m")
    cache = tmp_path / "cache" / weights.DIGEST_CACHE_FILE
    digest = weights.cached_sha256(path, cache)
    # Another interpreter whose hashing fails outright: only the cache file can give it the digest.
    script = ("import sys; from pathlib import Path; from pytest_llmserve import weights\n"
              "def refuse(path): raise AssertionError(f'hashed {path} again')\n"
              "weights.file_sha256 = refuse\n"
              "print(weights.cached_sha256(Path(sys.argv[1]), Path(sys.argv[2])))\n")
    done = subprocess.run([sys.executable, "-c", script, str(path), str(cache)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == digest


def test_without_a_cache_entry_the_weights_are_hashed(tmp_path: Path, hashings: list[Path]) -> None:
    """The counter's other side: a cache of another file, or no cache, gives no digest for this one."""
    first, second = _weights(tmp_path / "a"), _weights(tmp_path / "b", fill=2)
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    weights.cached_sha256(first, cache)
    assert weights.cached_sha256(second, cache) == hashlib.sha256(second.read_bytes()).hexdigest()
    assert hashings == [first.resolve(), second.resolve()]
    assert set(json.loads(cache.read_text())["files"]) == {str(first.resolve()), str(second.resolve())}


def test_a_file_rewritten_with_a_new_mtime_is_hashed_again(tmp_path: Path, hashings: list[Path]) -> None:
    path = _weights(tmp_path / "m", fill=1)
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    old = weights.cached_sha256(path, cache)
    size = path.stat().st_size
    _weights(tmp_path / "m", fill=2)  # same size, other bytes
    _bump_mtime(path)
    assert path.stat().st_size == size
    new = weights.cached_sha256(path, cache)
    assert new != old and new == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(hashings) == 2
    assert json.loads(cache.read_text())["files"][str(path.resolve())]["sha256"] == new


def test_a_file_of_another_size_is_hashed_again(tmp_path: Path, hashings: list[Path]) -> None:
    path = _weights(tmp_path / "m", count=64)
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    weights.cached_sha256(path, cache)
    mtime = path.stat().st_mtime_ns
    _weights(tmp_path / "m", count=128)
    os.utime(path, ns=(mtime, mtime))  # only the size tells
    assert weights.cached_sha256(path, cache) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(hashings) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", json.dumps({"schema": 99, "files": {}}),
                                     json.dumps({"schema": 1, "files": []}), "\x00\x01"])
def test_a_corrupt_cache_is_ignored_and_rewritten(tmp_path: Path, content: str, hashings: list[Path]) -> None:
    path = _weights(tmp_path / "m")
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    cache.write_text(content)
    digest = weights.cached_sha256(path, cache)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and len(hashings) == 1
    data = json.loads(cache.read_text())
    assert data["schema"] == 1 and data["files"][str(path.resolve())]["sha256"] == digest
    assert weights.cached_sha256(path, cache) == digest and len(hashings) == 1


def test_a_bad_entry_is_dropped_and_never_believed(tmp_path: Path, hashings: list[Path]) -> None:
    """An entry that matches the file's size and mtime but is not one this code wrote (a digest of the wrong
    length) is not taken as the digest."""
    path = _weights(tmp_path / "m")
    st = path.stat()
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    bad = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": "abc"}
    cache.write_text(json.dumps({"schema": 1, "files": {str(path.resolve()): bad}}))
    assert weights.cached_sha256(path, cache) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(hashings) == 1


def test_entries_of_files_gone_or_changed_are_dropped_when_the_cache_is_written(tmp_path: Path) -> None:
    gone, changed, kept = (_weights(tmp_path / n) for n in ("gone", "changed", "kept"))
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    for path in (gone, changed, kept):
        weights.cached_sha256(path, cache)
    gone.unlink()
    _bump_mtime(changed)
    weights.cached_sha256(_weights(tmp_path / "new"), cache)
    assert set(json.loads(cache.read_text())["files"]) == {str(kept.resolve()), str((tmp_path / "new").resolve()
                                                                                     / weights.WEIGHTS_FILE)}


def test_a_file_written_while_it_was_hashed_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _weights(tmp_path / "m")
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    real = weights.file_sha256

    def hashed_during_a_write(target: Path) -> str:
        digest = real(target)
        _bump_mtime(target)  # the writer finishes after the read
        return digest

    monkeypatch.setattr(weights, "file_sha256", hashed_during_a_write)
    weights.cached_sha256(path, cache)
    assert not cache.exists()
    monkeypatch.setattr(weights, "file_sha256", real)
    weights.cached_sha256(path, cache)
    assert str(path.resolve()) in json.loads(cache.read_text())["files"]


def test_an_unwritable_cache_still_gives_the_digest(tmp_path: Path, hashings: list[Path]) -> None:
    path = _weights(tmp_path / "m")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    cache = blocker / weights.DIGEST_CACHE_FILE
    assert weights.cached_sha256(path, cache) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert weights.cached_sha256(path, cache) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(hashings) == 2  # nothing kept, so hashed each time
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_a_symlinked_weights_file_is_keyed_by_its_target(tmp_path: Path, hashings: list[Path]) -> None:
    """A hub cache's snapshot links to a blob: two links to one blob are one file, hashed once."""
    blob = _weights(tmp_path / "blobs")
    links = []
    for name in ("snap-a", "snap-b"):
        (tmp_path / name).mkdir()
        link = tmp_path / name / weights.WEIGHTS_FILE
        link.symlink_to(blob)
        links.append(link)
    cache = tmp_path / weights.DIGEST_CACHE_FILE
    assert weights.cached_sha256(links[0], cache) == weights.cached_sha256(links[1], cache)
    assert hashings == [blob.resolve()]


def test_safetensors_files_lists_every_weights_file_sorted(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    _weights(folder)
    (folder / "extra.safetensors").write_bytes(b"")
    (folder / "config.json").write_text("{}")
    (folder / "dir.safetensors").mkdir()
    assert weights.safetensors_files(folder) == (folder / "extra.safetensors", folder / "model.safetensors")

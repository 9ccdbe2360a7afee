"""Derive deliberately broken checkpoints from a healthy Hugging Face safetensors model directory.

The oracles need known-bad servers to prove that they fail: a model whose logits are NaN and a model
that stays finite but decodes garbage. Both are made from the healthy model by editing its safetensors
files, so the engine, tokenizer and config stay exactly the same and only the weights differ.

Kinds:

``nan``
    Every element of one mid-depth decoder layer's ``input_layernorm`` weight (the RMSNorm scale in
    front of attention) and of its MLP ``down_proj`` weight is set to NaN. Either alone puts NaN into
    the residual stream at that layer, and from there into every later layer and the logits, for
    every token, prefill and decode alike (a partial NaN would only poison some positions).
``scrambled``
    The decoder layers are put in reverse order (tensor names ``...layers.{i}...`` are renamed to
    ``...layers.{L-1-i}...``; the bytes are untouched). Every weight stays finite and well scaled, so
    the engine produces finite, confident logprobs, but the text collapses into repetitive garbage.
``healthy-copy``
    A byte-identical copy (a control: the derivation itself must not break a model).

The source directory is never written. The destination is built in a temporary sibling directory and
renamed into place, and carries a marker file (``.llmserve-derived.json``) with the kind and a hash of
the source, so a second call with the same source and kind does nothing. A destination without a
marker is never overwritten.

The edits are plain byte operations on the safetensors format (an 8-byte little-endian header length,
a JSON header of ``name -> {dtype, shape, data_offsets}``, then the raw data), so this module needs
only the standard library; it runs in the plugin's interpreter or in the engine's. Run it as::

    python -m pytest_llmserve.testing.checkpoints SRC DST --kind nan

or from code with :func:`derive_checkpoint` (in-process) or :func:`derive_checkpoint_with` (in another
interpreter, e.g. the engine's venv python, with this package put on its ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

KINDS = ("nan", "scrambled", "healthy-copy")
MARKER = ".llmserve-derived.json"
DERIVATION_VERSION = 1  # bump when a kind's recipe changes, so old derived dirs are rebuilt

# One NaN element of each float dtype, little-endian (quiet NaN bit patterns).
NAN_BYTES: dict[str, bytes] = {
    "BF16": struct.pack("<H", 0x7FC0),
    "F16": struct.pack("<H", 0x7E00),
    "F32": struct.pack("<I", 0x7FC00000),
    "F64": struct.pack("<Q", 0x7FF8000000000000),
}
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
_LAYER_RE = re.compile(r"^(?P<prefix>.*?\blayers\.)(?P<index>\d+)(?P<rest>\..+)$")
# Tensors planted with NaN in the chosen layer, in order of preference (Llama/Qwen/Mistral naming).
_NAN_TARGETS = ("input_layernorm.weight", "mlp.down_proj.weight")
_COPY_CHUNK = 16 * 1024 * 1024


class CheckpointError(Exception):
    """The source is not a usable safetensors model directory, or the destination cannot be written."""


# --------------------------------------------------------------------------------------------------
# safetensors: read and write headers
# --------------------------------------------------------------------------------------------------

def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the byte offset where its data begins."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", raw)
        if size > 100 * 1024 * 1024:
            raise CheckpointError(f"{path}: not a safetensors file (header length {size} is implausible)")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not a safetensors file (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + size


def encode_header(header: Mapping[str, Any]) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple of 8 like safetensors."""
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body


def write_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, tuple[str, Sequence[int], bytes]],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``name -> (dtype, shape, raw little-endian bytes)`` as a safetensors file (tiny models)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        if dtype not in DTYPE_SIZES or len(data) != count * DTYPE_SIZES[dtype]:
            raise CheckpointError(f"{name}: {len(data)} bytes do not hold {dtype}{list(shape)}")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    with open(path, "wb") as f:
        f.write(encode_header(header))
        for _, _, data in tensors.values():
            f.write(data)


def read_tensor_bytes(path: str | os.PathLike[str], name: str) -> tuple[str, list[int], bytes]:
    """``(dtype, shape, raw bytes)`` of one tensor (tests and diagnostics)."""
    header, data_start = read_header(path)
    if name not in header or name == "__metadata__":
        raise CheckpointError(f"{path}: no tensor {name!r}")
    info = header[name]
    begin, end = info["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        return str(info["dtype"]), list(info["shape"]), f.read(end - begin)


def _copy_range(src: BinaryIO, dst: BinaryIO, length: int) -> None:
    while length > 0:
        chunk = src.read(min(_COPY_CHUNK, length))
        if not chunk:
            raise CheckpointError("safetensors file is shorter than its header says")
        dst.write(chunk)
        length -= len(chunk)


# --------------------------------------------------------------------------------------------------
# the model directory
# --------------------------------------------------------------------------------------------------

def weight_files(src: Path) -> list[Path]:
    files = sorted(p for p in src.iterdir() if p.is_file() and p.name.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no *.safetensors files (a Hugging Face safetensors model directory "
                              "with config.json and model.safetensors is expected)")
    return files


def source_hash(src: Path) -> str:
    """sha256 over the names and contents of every regular file in the source (markers excluded)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith(".")):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(_COPY_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def layer_indices(names: Sequence[str]) -> list[int]:
    """Sorted decoder layer indices found in tensor names (``model.layers.{i}.``...)."""
    found = {int(m.group("index")) for n in names if (m := _LAYER_RE.match(n))}
    return sorted(found)


def _all_tensor_names(files: Sequence[Path]) -> list[str]:
    names: list[str] = []
    for path in files:
        header, _ = read_header(path)
        names.extend(k for k in header if k != "__metadata__")
    return names


def nan_targets(names: Sequence[str], layer: int | None = None) -> list[str]:
    """The tensors the ``nan`` kind fills with NaN: norm and down-projection of the chosen layer."""
    layers = layer_indices(names)
    if not layers:
        raise CheckpointError("no decoder layers found (expected tensor names like "
                              "'model.layers.0.mlp.down_proj.weight')")
    chosen = layers[len(layers) // 2] if layer is None else layer
    if chosen not in layers:
        raise CheckpointError(f"layer {chosen} not in the model (layers {layers[0]}..{layers[-1]})")
    in_layer = [n for n in names if (m := _LAYER_RE.match(n)) and int(m.group("index")) == chosen]
    targets = [n for n in in_layer if any(n.endswith("." + t) for t in _NAN_TARGETS)]
    if not targets:
        # Unknown naming: take the layer's weight tensors (not biases), so the layer's output is NaN anyway.
        targets = [n for n in in_layer if n.endswith(".weight")]
    if not targets:
        raise CheckpointError(f"layer {chosen} has no weight tensors to plant NaN in: {in_layer}")
    return sorted(targets)


def scrambled_name(name: str, layers: Sequence[int]) -> str:
    """The tensor's name after reversing the decoder layer order."""
    m = _LAYER_RE.match(name)
    if not m:
        return name
    index = int(m.group("index"))
    position = layers.index(index)
    return f"{m.group('prefix')}{layers[len(layers) - 1 - position]}{m.group('rest')}"


def _derive_nan(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> dict[str, Any]:
    targets = set(nan_targets(_all_tensor_names(files), layer))
    planted: list[str] = []
    for path in files:
        out = dst / path.name
        shutil.copyfile(path, out)
        header, data_start = read_header(path)
        with open(out, "r+b") as f:
            for name in sorted(targets.intersection(header)):
                info = header[name]
                dtype = str(info["dtype"])
                if dtype not in NAN_BYTES:
                    raise CheckpointError(f"{path}: {name} has dtype {dtype}; NaN can be planted in "
                                          f"{', '.join(NAN_BYTES)} tensors only")
                begin, end = info["data_offsets"]
                element = NAN_BYTES[dtype]
                f.seek(data_start + begin)
                remaining = (end - begin) // len(element)
                while remaining > 0:
                    step = min(remaining, _COPY_CHUNK // len(element))
                    f.write(element * step)
                    remaining -= step
                planted.append(name)
    return {"nan_tensors": sorted(planted)}


def _derive_scrambled(src: Path, dst: Path, files: Sequence[Path]) -> dict[str, Any]:
    names = _all_tensor_names(files)
    layers = layer_indices(names)
    if len(layers) < 2:
        raise CheckpointError(f"{src}: {len(layers)} decoder layer(s) found; scrambling needs at least 2")
    renamed: dict[str, str] = {}
    for path in files:
        header, data_start = read_header(path)
        new_header: dict[str, Any] = {}
        for name, info in header.items():
            new_name = name if name == "__metadata__" else scrambled_name(name, layers)
            if new_name != name:
                renamed[name] = new_name
            new_header[new_name] = info
        # Keep the data bytes as they are: only names change, offsets stay valid.
        with open(path, "rb") as fin, open(dst / path.name, "wb") as fout:
            fout.write(encode_header(new_header))
            fin.seek(data_start)
            shutil.copyfileobj(fin, fout, _COPY_CHUNK)
    index = src / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        weight_map = data.get("weight_map", {})
        data["weight_map"] = {renamed.get(k, k): v for k, v in weight_map.items()}
        (dst / index.name).write_text(json.dumps(data, indent=2))
    order = [layers[len(layers) - 1 - i] for i in range(len(layers))]
    return {"layer_order": order}


def derive_checkpoint(src_dir: str | os.PathLike[str], dst_dir: str | os.PathLike[str], kind: str, *,
                      layer: int | None = None) -> Path:
    """Build ``dst_dir`` from the healthy model in ``src_dir`` (see the module docstring for kinds).

    Idempotent: returns at once when ``dst_dir`` already holds this kind derived from this source.
    """
    if kind not in KINDS:
        raise CheckpointError(f"kind = {kind!r}: must be one of {', '.join(KINDS)}")
    src = Path(src_dir).expanduser().resolve()
    dst = Path(dst_dir).expanduser().resolve()
    if not src.is_dir():
        raise CheckpointError(f"{src}: source model directory does not exist")
    if dst == src or src in dst.parents:
        raise CheckpointError(f"{dst}: destination must be outside the source {src}")
    files = weight_files(src)
    want = {"kind": kind, "source": str(src), "source_sha256": source_hash(src), "layer": layer,
            "version": DERIVATION_VERSION}
    # Two runs may derive the same checkpoint at once (xdist workers, parallel sessions sharing the cache):
    # the second one waits, then finds it made (seen: "Directory not empty" when both renamed into place).
    dst.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dst.parent / f".{dst.name}.lock")):
        return _derive_locked(src, dst, files, kind, layer, want)


def _derive_locked(src: Path, dst: Path, files: list[Path], kind: str, layer: int | None,
                   want: dict[str, Any]) -> Path:
    marker = dst / MARKER
    if dst.exists():
        if not marker.is_file():
            if dst.is_dir() and not any(dst.iterdir()):
                dst.rmdir()
            else:
                raise CheckpointError(f"{dst}: exists and was not made by derive_checkpoint "
                                      f"(no {MARKER}); refusing to overwrite it")
        else:
            try:
                have = json.loads(marker.read_text())
            except (OSError, json.JSONDecodeError):
                have = {}
            if all(have.get(k) == v for k, v in want.items() if k != "source"):
                return dst
            shutil.rmtree(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the engine may run as another user
    try:
        for path in sorted(src.iterdir()):
            # Config, tokenizer and chat template are copied unchanged; dot-files (markers) are not.
            if path.is_file() and not path.name.endswith(".safetensors") and not path.name.startswith("."):
                shutil.copyfile(path, tmp / path.name)
        details: dict[str, Any]
        if kind == "nan":
            details = _derive_nan(src, tmp, files, layer)
        elif kind == "scrambled":
            details = _derive_scrambled(src, tmp, files)
        else:
            for path in files:
                shutil.copyfile(path, tmp / path.name)
            details = {}
        (tmp / MARKER).write_text(json.dumps({**want, **details}, indent=2) + "\n")
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def derive_checkpoint_with(python: str, src: str | os.PathLike[str], dst: str | os.PathLike[str], kind: str,
                           *, layer: int | None = None, timeout_s: float = 600.0) -> Path:
    """Run :func:`derive_checkpoint` in another interpreter (e.g. the engine venv's python)."""
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    argv = [python, "-m", "pytest_llmserve.testing.checkpoints", str(src), str(dst), "--kind", kind]
    if layer is not None:
        argv += ["--layer", str(layer)]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckpointError(f"{' '.join(argv)}: {exc}") from exc
    if proc.returncode != 0:
        raise CheckpointError(f"{' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return Path(dst).expanduser().resolve()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_llmserve.testing.checkpoints",
                                     description="Derive a broken (or control) checkpoint from a healthy "
                                                 "safetensors model directory.")
    parser.add_argument("src", help="healthy model directory (config.json, *.safetensors, tokenizer files)")
    parser.add_argument("dst", help="directory to create")
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--layer", type=int, default=None,
                        help="layer for --kind nan (default: the middle one)")
    args = parser.parse_args(argv)
    try:
        out = derive_checkpoint(args.src, args.dst, args.kind, layer=args.layer)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

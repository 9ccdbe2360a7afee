"""Derive deliberately broken checkpoints from a healthy Hugging Face safetensors model directory.

The oracles need known-bad servers to prove that they fail (a fault catalogue, run as a mutation score):
a model whose logits are NaN, one that stays finite but decodes garbage, and subtler faults, each
injected where it is real. All are made from the healthy model by editing its safetensors files (and, for
three kinds, a config file), so the engine and tokenizer stay exactly the same.

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

The fault kinds below name their tokens by text (looked up in ``tokenizer.json``) and were chosen on the
embedded SmolLM2-135M-Instruct. Their effects there were measured with HF transformers 5.19.0 (torch
2.13.0+cpu, bf16, greedy) on this project's 2-core AMD EPYC CPU host on 2026-12-05, by
``tools/measure_fault_checkpoints.py``; the full record (every prompt, gaps, top-5) is
``tests/data/power/fault_checkpoints_hf.json``. Positions count generated tokens from 0; "the probes" are
the oracles' defaults at the plugin's lengths (32 tokens; 64 for the determinism letter, 256 for the
story and butterfly long decodes). Not yet measured on the served vLLM engine.

``nan-late``
    Untie the embeddings (``lm_head.weight`` written as a byte copy of the embedding,
    ``tie_word_embeddings: false``), then set the input-embedding rows of ``:`` and `` and`` to NaN.
    The output head is intact, so greedy decoding chooses these tokens as before; the step after it
    reads one back, NaN enters the residual stream and the KV cache, and every later logit is NaN.
    Stands for a corrupt or uninitialised embedding row of a token no prompt uses (a bad storage
    block, rows added to a vocabulary and never trained). Neither token is in a default prompt, the
    chat template's system prompt or the readiness request ("Hello"), so prefill and the first tokens
    are finite. Measured, NaN from position: "The capital of France is" 8, "Once upon a time..." 20,
    "The three primary colors are" 12 (3 of the 4 NaN probes; the chat capital never), "To make a
    simple tomato soup..." 11, "The most important thing..." 4, story 60, butterfly 25, letter 52;
    never within the probe's length: the chat capital, "In 1969...", "Water boils...",
    "Photosynthesis..." and the three known answers (still correct).
``wrong-eos``
    The weights stay byte-identical; ``generation_config.json``'s ``eos_token_id`` becomes
    ``[<the real EOS>, ".", ",", " of", "\n", "'s"]`` (SmolLM2: ``[2, 30, 28, 282, 198, 506]``). vLLM
    adds a generation config's extra EOS ids to every request's stop tokens
    (``SamplingParams.update_from_generation_config``), so answers stop after a few tokens. Stands for a
    wrong EOS list in generation_config (e.g. copied from a model with another tokenizer, whose end
    ids are ordinary tokens here). One token cannot stop every probe early ("." alone, the best
    single one, lets "The three primary colors are" run all 32 tokens and the story 25); these five
    stop every default probe after 1-9 answer tokens, none at the first token (no empty answer):
    chat capital 2 ("The capital"), "The capital of France is" 1 (" Paris"), "Once upon a time..."
    9, the other raw probes 3-5, the two other known answers 2, story 4, butterfly 3, letter 5.
``lm-head-flip``
    Untie as for ``nan-late``, then multiply the output-head rows of ``*``, `` an`` and `` light`` by
    1.12 (in float32, rounded to nearest-even bf16 as torch does). Where such a token was the healthy
    runner-up 1-3 nats below the choice, it now wins: greedy tokens flip to near runner-ups, the
    subtle fault that top-k membership (vLLM's ``check_logprobs_close``) lets through. Stands for
    per-row output-channel scales of a quantized LM head off by about 12% on a few rows. Chosen from
    the healthy logits (exact up to the first divergence, since only the head changes): sets of up to
    three frequent runner-up tokens and factors 1.03-1.30 were kept when every divergence over the
    differential probes had a healthy gap in 1.05-2.95 nats, the flip won by at least 0.2 logits, and
    no scaled token came within 0.2 logits of winning earlier; this one holds for factors 1.10-1.13.
    Measured on the 9 differential probes: 5 diverge, "The capital of France is" at 3 (healthy gap
    1.625 nats), "The three primary colors are" 13 (2.375), "Water boils..." 22 (2.25),
    "Photosynthesis..." 1 (1.5), "The most important thing..." 12 (2.5); at each, the variant's token
    is in the healthy top-5 and the healthy token in the variant's top-5; known answers unchanged.
``answer-swap``
    Swap the embedding rows of `` Paris`` and `` London`` (and of the output head, where the model has
    its own). With tied embeddings one swap swaps what the model says and what it reads, so it stays
    fluent and answers "The capital of France is London." (the healthy answer uses `` Paris``, id
    7042; `` London`` is 4528). Stands for a known answer changed by a bad fine-tune or merge.
    Measured: Japan "The capital of Japan is Tokyo.", hot "The opposite of hot is cold." (unchanged);
    of the differential probes only the two France prompts diverge (healthy gap 3.8 and 4.1 nats).
``attn-drift``
    Every decoder layer's ``self_attn.o_proj.weight`` times 1.05 (``layer`` picks one layer instead):
    attention outputs 5% too large everywhere, small but systematic, as a slightly wrong attention
    kernel (a normalisation or FP8 output scale off) gives. Measured on the 9 differential probes:
    largest |Δlogprob| of the chosen tokens before the first divergence 0.47 nats ("To make a simple
    tomato soup...", no divergence), 0.42 ("The three primary colors are", diverges at 11), the others
    0.09-0.28; 7 of 9 keep their first 8 tokens (the two early flips, at 2 and 4, are healthy
    near-ties of 0.06 nats); known answers unchanged.

The source directory is never written. The destination is built in a temporary sibling directory and
renamed into place, and carries a marker file (``.llmserve-derived.json``) with the kind and a hash of
the source, so a second call with the same source and kind does nothing (the marker also records what the
kind changed). A destination without a marker is never overwritten.

The edits are plain byte operations on the safetensors format (an 8-byte little-endian header length,
a JSON header of ``name -> {dtype, shape, data_offsets}``, then the raw data), so this module needs
only the standard library; it runs in the plugin's interpreter or in the engine's. Scaling goes through a
table of all 65,536 16-bit patterns, so even every layer's o_proj needs no numpy (each fault kind derived
SmolLM2 in 0.4-1.3 s here, timed with /usr/bin/time on the CLI). Run it as::

    python -m pytest_llmserve.testing.checkpoints SRC DST --kind nan

or from code with :func:`derive_checkpoint` (in-process) or :func:`derive_checkpoint_with` (in another
interpreter, e.g. the engine's venv python, with this package put on its ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from filelock import FileLock

from pytest_llmserve.json_encoding import dumps

KINDS = ("nan", "scrambled", "healthy-copy", "nan-late", "wrong-eos", "lm-head-flip", "answer-swap", "attn-drift")
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
#: What a derivation records in the checkpoint's marker (JSON): the fault's details, the source's identity.
Details = dict[str, object]
#: The elements of an ``array`` of weights: bf16/f16 bit patterns or f32/f64 values.
_Number = TypeVar("_Number", int, float)

# The recipes of the fault kinds, named by token text and looked up in the model's tokenizer.json, so a
# recipe means the same words on any checkpoint that shares the tokenizer. Chosen on SmolLM2-135M-Instruct
# (how: the module docstring; the measured effects: tests/data/power/fault_checkpoints_hf.json).
NAN_LATE_TOKENS = (":", " and")
WRONG_EOS_TOKENS = (".", ",", " of", "\n", "'s")
LM_HEAD_FLIP_TOKENS = ("*", " an", " light")
LM_HEAD_FLIP_FACTOR = 1.12
ANSWER_SWAP_TOKENS = (" Paris", " London")
ATTN_DRIFT_FACTOR = 1.05
ATTN_DRIFT_TENSOR = "self_attn.o_proj.weight"
EMBEDDING_SUFFIX = "embed_tokens.weight"
LM_HEAD = "lm_head.weight"


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


def encode_header(header: Mapping[str, object]) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple of 8 like safetensors."""
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body


def write_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, tuple[str, Sequence[int], bytes]],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``name -> (dtype, shape, raw little-endian bytes)`` as a safetensors file (tiny models)."""
    header: dict[str, object] = {}
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


def _derive_nan(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
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


def _derive_scrambled(src: Path, dst: Path, files: Sequence[Path]) -> Details:
    names = _all_tensor_names(files)
    layers = layer_indices(names)
    if len(layers) < 2:
        raise CheckpointError(f"{src}: {len(layers)} decoder layer(s) found; scrambling needs at least 2")
    renamed: dict[str, str] = {}
    for path in files:
        header, data_start = read_header(path)
        new_header: dict[str, object] = {}
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
        (dst / index.name).write_text(dumps(data, indent=2))
    order = [layers[len(layers) - 1 - i] for i in range(len(layers))]
    return {"layer_order": order}


# --------------------------------------------------------------------------------------------------
# tokens: a recipe's words to the model's token ids
# --------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character map (byte-level BPE vocabularies spell a space 'Ġ', a newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shifted)
            shifted += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def token_ids(model_dir: str | os.PathLike[str], texts: Sequence[str]) -> dict[str, int]:
    """The id of each text that is one token of the model's ``tokenizer.json`` (byte-level BPE spelling
    first, then the text as it is, then SentencePiece's '▁' for a space)."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read the tokenizer ({exc}); this kind names tokens by text") from None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        raise CheckpointError(f"{path}: no model.vocab mapping (a Hugging Face BPE tokenizer.json is expected)")
    known: dict[str, int] = {k: v for k, v in vocab.items() if isinstance(v, int)}
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
            known[added["content"]] = added["id"]
    alphabet = _byte_level_alphabet()
    found: dict[str, int] = {}
    for text in texts:
        byte_level = "".join(alphabet[b] for b in text.encode("utf-8"))
        spelling = next((s for s in (byte_level, text, text.replace(" ", "▁")) if s in known), None)
        if spelling is None:
            raise CheckpointError(f"{path}: {text!r} is not a single token of this tokenizer "
                                  f"(looked for {byte_level!r}, {text!r}, {text.replace(' ', '▁')!r})")
        found[text] = known[spelling]
    return found


# --------------------------------------------------------------------------------------------------
# editing the destination's copied weights in place
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _TensorAt:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the tensor's data in its file
    length: int

    @property
    def row_length(self) -> int:
        """Bytes in one row (the first dimension indexes rows: vocabulary entries, output channels)."""
        return self.length // self.shape[0]


class _WeightFiles:
    """The safetensors files already copied into the destination, edited in place by byte offset."""

    def __init__(self, directory: Path, files: Sequence[Path]) -> None:
        self.directory = directory
        self.paths = [directory / p.name for p in files]
        self.tensors: dict[str, _TensorAt] = {}
        self._index()

    def _index(self) -> None:
        self.tensors.clear()
        for path in self.paths:
            header, data_start = read_header(path)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                self.tensors[name] = _TensorAt(path, str(info["dtype"]), tuple(info["shape"]), data_start + begin,
                                               end - begin)

    def named(self, suffix: str) -> str:
        matches = sorted(n for n in self.tensors if n == suffix or n.endswith("." + suffix))
        if len(matches) != 1:
            raise CheckpointError(f"expected one tensor named '*{suffix}', found {matches or 'none'}")
        return matches[0]

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        t = self.tensors[name]
        size = t.length - offset if length is None else length
        with open(t.path, "rb") as f:
            f.seek(t.start + offset)
            return f.read(size)

    def write(self, name: str, data: bytes, offset: int = 0) -> None:
        t = self.tensors[name]
        if offset + len(data) > t.length:
            raise CheckpointError(f"{name}: writing {len(data)} bytes at {offset} overruns its {t.length} bytes")
        with open(t.path, "r+b") as f:
            f.seek(t.start + offset)
            f.write(data)

    def read_row(self, name: str, row: int) -> bytes:
        t = self.tensors[name]
        self._check_row(name, row)
        return self.read(name, row * t.row_length, t.row_length)

    def write_row(self, name: str, row: int, data: bytes) -> None:
        self._check_row(name, row)
        self.write(name, data, row * self.tensors[name].row_length)

    def _check_row(self, name: str, row: int) -> None:
        rows = self.tensors[name].shape[0]
        if not 0 <= row < rows:
            raise CheckpointError(f"{name}: row {row} out of range (the tensor has {rows} rows; the tokenizer "
                                  "knows more tokens than this checkpoint's vocabulary)")

    def append_copy(self, new_name: str, of_name: str) -> None:
        """Add ``new_name`` as a byte copy of ``of_name``, at the end of the same file (and its index)."""
        source = self.tensors[of_name]
        header, data_start = read_header(source.path)
        data_length = max((info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"),
                          default=0)
        header[new_name] = {"dtype": source.dtype, "shape": list(source.shape),
                            "data_offsets": [data_length, data_length + source.length]}
        rewritten = source.path.with_name(source.path.name + ".part")
        with open(source.path, "rb") as fin, open(rewritten, "wb") as fout:
            fout.write(encode_header(header))
            fin.seek(data_start)
            _copy_range(fin, fout, data_length)
            fin.seek(source.start)
            _copy_range(fin, fout, source.length)
        os.replace(rewritten, source.path)
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            data = json.loads(index.read_text())
            data.setdefault("weight_map", {})[new_name] = source.path.name
            metadata = data.get("metadata")
            if isinstance(metadata, dict) and isinstance(metadata.get("total_size"), int):
                metadata["total_size"] += source.length
            index.write_text(dumps(data, indent=2))
        self._index()


def _untie(weights: _WeightFiles, config_path: Path) -> bool:
    """Give the model an output head of its own: ``lm_head.weight``, a byte copy of the input embedding,
    and ``tie_word_embeddings: false``, so either can be edited without the other. True when it was tied."""
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: cannot read the model config ({exc})") from None
    has_head = LM_HEAD in weights.tensors
    # Without a separate head the weights are tied whatever the config says (Llama's default is untied,
    # and a loader would then fail on the missing lm_head.weight).
    tied = config.get("tie_word_embeddings") is True or not has_head
    if not has_head:
        weights.append_copy(LM_HEAD, weights.named(EMBEDDING_SUFFIX))
    if tied or "tie_word_embeddings" not in config:
        config["tie_word_embeddings"] = False
        config_path.write_text(dumps(config, indent=2) + "\n")
    return tied


# --------------------------------------------------------------------------------------------------
# scaling float tensors as the engine's dtype would store them
# --------------------------------------------------------------------------------------------------

def _as_float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _scaled_16bit(pattern: int, dtype: str, factor32: float) -> int:
    if dtype == "BF16":
        value = struct.unpack("<f", struct.pack("<I", pattern << 16))[0]
    else:
        value = struct.unpack("<e", struct.pack("<H", pattern))[0]
    if not math.isfinite(value):
        return pattern
    # float32 × float32 is exact in a double; packing rounds it once to float32: torch's bf16/f16 × scalar.
    try:
        product = struct.pack("<f", value * factor32)
    except OverflowError:
        product = struct.pack("<f", math.copysign(math.inf, value * factor32))
    if dtype == "F16":
        try:
            return int(struct.unpack("<H", struct.pack("<e", struct.unpack("<f", product)[0]))[0])
        except OverflowError:
            return int(struct.unpack("<H", struct.pack("<e", math.copysign(math.inf, value)))[0])
    bits = int(struct.unpack("<I", product)[0])
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even, like torch


@lru_cache(maxsize=4)
def _scale_table(dtype: str, factor: float) -> tuple[int, ...]:
    """Every 16-bit pattern's scaled pattern: one lookup per element keeps a whole layer fast in pure Python."""
    factor32 = _as_float32(factor)
    return tuple(_scaled_16bit(pattern, dtype, factor32) for pattern in range(1 << 16))


def scale_values(dtype: str, data: bytes, factor: float) -> bytes:
    """``data`` (little-endian ``dtype`` elements) times ``factor``, computed in float32 and rounded to
    nearest even as ``(w.float() * factor).to(w.dtype)`` does in torch; NaN and infinities stay as they are."""
    if dtype in ("BF16", "F16"):
        patterns = _little_endian(array("H"), data)
        table = _scale_table(dtype, factor)
        return _little_endian(array("H", map(table.__getitem__, patterns))).tobytes()
    if dtype in ("F32", "F64"):
        code = "f" if dtype == "F32" else "d"
        values = _little_endian(array(code), data)
        multiplier = _as_float32(factor) if dtype == "F32" else factor
        return _little_endian(array(code, (v * multiplier for v in values))).tobytes()
    raise CheckpointError(f"cannot scale {dtype} values (BF16, F16, F32 and F64 only)")


def _little_endian(values: array[_Number], data: bytes = b"") -> array[_Number]:
    """Load ``data`` into ``values`` (if given) and swap bytes on a big-endian host: safetensors is little-endian."""
    if data:
        values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


# --------------------------------------------------------------------------------------------------
# the fault kinds beyond nan/scrambled
# --------------------------------------------------------------------------------------------------

def _copy_weights(dst: Path, files: Sequence[Path]) -> _WeightFiles:
    for path in files:
        shutil.copyfile(path, dst / path.name)
    return _WeightFiles(dst, files)


def _derive_nan_late(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
    tokens = token_ids(src, NAN_LATE_TOKENS)
    weights = _copy_weights(dst, files)
    # Untie first: the output head keeps the healthy rows, so greedy decoding can still choose these tokens;
    # only reading one back (its input embedding) poisons the residual stream, and then the KV cache.
    untied = _untie(weights, dst / "config.json")
    embedding = weights.named(EMBEDDING_SUFFIX)
    t = weights.tensors[embedding]
    if t.dtype not in NAN_BYTES:
        raise CheckpointError(f"{embedding} has dtype {t.dtype}; NaN can be planted in {', '.join(NAN_BYTES)} only")
    for token in tokens.values():
        weights.write_row(embedding, token, NAN_BYTES[t.dtype] * (t.row_length // len(NAN_BYTES[t.dtype])))
    return {"nan_rows": {"tensor": embedding, "tokens": tokens}, "untied": untied}


def _derive_wrong_eos(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
    tokens = token_ids(src, WRONG_EOS_TOKENS)
    _copy_weights(dst, files)  # the weights stay byte-identical: only the stop list is wrong
    path = dst / "generation_config.json"
    generation: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    eos = generation.get("eos_token_id")
    if eos is None:
        config_path = dst / "config.json"
        eos = json.loads(config_path.read_text()).get("eos_token_id") if config_path.is_file() else None
    if eos is None:
        raise CheckpointError(f"{src}: no eos_token_id in generation_config.json or config.json to extend")
    real = [eos] if isinstance(eos, int) else list(eos)
    generation["eos_token_id"] = real + [i for i in tokens.values() if i not in real]
    path.write_text(dumps(generation, indent=2) + "\n")
    return {"eos_token_id": generation["eos_token_id"], "ordinary_stop_tokens": tokens}


def _derive_lm_head_flip(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
    tokens = token_ids(src, LM_HEAD_FLIP_TOKENS)
    weights = _copy_weights(dst, files)
    untied = _untie(weights, dst / "config.json")
    dtype = weights.tensors[LM_HEAD].dtype
    for token in tokens.values():
        weights.write_row(LM_HEAD, token, scale_values(dtype, weights.read_row(LM_HEAD, token), LM_HEAD_FLIP_FACTOR))
    return {"scaled_rows": {"tensor": LM_HEAD, "tokens": tokens, "factor": LM_HEAD_FLIP_FACTOR}, "untied": untied}


def _derive_answer_swap(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
    tokens = token_ids(src, ANSWER_SWAP_TOKENS)
    first, second = (tokens[t] for t in ANSWER_SWAP_TOKENS)
    weights = _copy_weights(dst, files)
    # Tied weights: one swap changes what the model says and what it reads. An untied model gets the same
    # swap in its output head, so the two stay consistent there too.
    swapped = [weights.named(EMBEDDING_SUFFIX)] + ([LM_HEAD] if LM_HEAD in weights.tensors else [])
    for name in swapped:
        a, b = weights.read_row(name, first), weights.read_row(name, second)
        weights.write_row(name, first, b)
        weights.write_row(name, second, a)
    return {"swapped_rows": {"tensors": swapped, "tokens": tokens}}


def _derive_attn_drift(src: Path, dst: Path, files: Sequence[Path], layer: int | None) -> Details:
    weights = _copy_weights(dst, files)
    layers = layer_indices(list(weights.tensors))
    if layer is not None and layer not in layers:
        raise CheckpointError(f"layer {layer} not in the model (layers {layers[0] if layers else '-'}.."
                              f"{layers[-1] if layers else '-'})")
    targets = sorted(n for n in weights.tensors if n.endswith("." + ATTN_DRIFT_TENSOR)
                     and (m := _LAYER_RE.match(n)) and (layer is None or int(m.group("index")) == layer))
    if not targets:
        raise CheckpointError(f"{src}: no '*.{ATTN_DRIFT_TENSOR}' tensors to scale")
    for name in targets:
        weights.write(name, scale_values(weights.tensors[name].dtype, weights.read(name), ATTN_DRIFT_FACTOR))
    return {"scaled_tensors": targets, "factor": ATTN_DRIFT_FACTOR}


_FAULT_RECIPES: dict[str, Callable[[Path, Path, Sequence[Path], int | None], Details]] = {
    "nan-late": _derive_nan_late,
    "wrong-eos": _derive_wrong_eos,
    "lm-head-flip": _derive_lm_head_flip,
    "answer-swap": _derive_answer_swap,
    "attn-drift": _derive_attn_drift,
}


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
    want: Details = {"kind": kind, "source": str(src), "source_sha256": source_hash(src), "layer": layer,
                     "version": DERIVATION_VERSION}
    # Two runs may derive the same checkpoint at once (xdist workers, parallel sessions sharing the cache):
    # the second one waits, then finds it made (seen: "Directory not empty" when both renamed into place).
    dst.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dst.parent / f".{dst.name}.lock")):
        return _derive_locked(src, dst, files, kind, layer, want)


def _derive_locked(src: Path, dst: Path, files: list[Path], kind: str, layer: int | None,
                   want: Details) -> Path:
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
        details: Details
        if kind == "nan":
            details = _derive_nan(src, tmp, files, layer)
        elif kind == "scrambled":
            details = _derive_scrambled(src, tmp, files)
        elif kind in _FAULT_RECIPES:
            details = _FAULT_RECIPES[kind](src, tmp, files, layer)
        else:
            for path in files:
                shutil.copyfile(path, tmp / path.name)
            details = {}
        (tmp / MARKER).write_text(dumps({**want, **details}, indent=2) + "\n")
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
                        help="layer for --kind nan (default: the middle one) or attn-drift (default: all)")
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

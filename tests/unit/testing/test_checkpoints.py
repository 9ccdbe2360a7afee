"""Derived checkpoints on a tiny random Llama-shaped safetensors model written by hand."""

from __future__ import annotations

import glob
import json
import math
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmserve.testing.checkpoints import (
    MARKER,
    CheckpointError,
    derive_checkpoint,
    derive_checkpoint_with,
    encode_header,
    layer_indices,
    main,
    nan_targets,
    read_header,
    read_tensor_bytes,
    source_hash,
    write_safetensors,
)

HIDDEN, INTER, LAYERS, VOCAB = 8, 16, 4, 32


def bf16(values: list[float]) -> bytes:
    # Truncate float32 to its upper 16 bits: bfloat16.
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in values)


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def floats_of(dtype: str, data: bytes) -> list[float]:
    if dtype == "F32":
        return list(struct.unpack(f"<{len(data) // 4}f", data))
    if dtype == "F16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    assert dtype == "BF16"
    return [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]


def tiny_tensors(dtype: str = "BF16", seed: int = 0) -> dict[str, tuple[str, list[int], bytes]]:
    rng = random.Random(seed)
    pack = bf16 if dtype == "BF16" else f32

    def rand(*shape: int) -> tuple[str, list[int], bytes]:
        return dtype, list(shape), pack([rng.gauss(0, 0.05) for _ in range(math.prod(shape))])

    def ones(n: int) -> tuple[str, list[int], bytes]:
        return dtype, [n], pack([1.0] * n)

    tensors = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "model.norm.weight": ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[p + f"self_attn.{name}.weight"] = rand(HIDDEN, HIDDEN)
        tensors[p + "mlp.gate_proj.weight"] = rand(INTER, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = rand(INTER, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTER)
    return tensors


def make_model(root: Path, dtype: str = "BF16", sharded: bool = False) -> Path:
    src = root / "tiny"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
                                                 "num_hidden_layers": LAYERS, "vocab_size": VOCAB}))
    (src / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (src / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    (src / "chat_template.jinja").write_text("{{ messages }}")
    (src / ".llmserve-ready").write_text("{}")  # the setup's own marker: not copied
    tensors = tiny_tensors(dtype)
    if not sharded:
        write_safetensors(src / "model.safetensors", tensors, {"format": "pt"})
        return src
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, members in shards.items():
        write_safetensors(src / shard, {n: tensors[n] for n in members}, {"format": "pt"})
        weight_map.update({n: shard for n in members})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return src


def tree_state(path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()}


def test_safetensors_header_round_trip(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "a.safetensors", {"x": ("F32", [2], f32([1.0, 2.0]))}, {"format": "pt"})
    header, start = read_header(tmp_path / "a.safetensors")
    assert header["x"] == {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert start % 8 == 0
    assert len(encode_header(header)) % 8 == 0
    assert floats_of("F32", read_tensor_bytes(tmp_path / "a.safetensors", "x")[2]) == [1.0, 2.0]
    with pytest.raises(CheckpointError, match="do not hold"):
        write_safetensors(tmp_path / "b.safetensors", {"x": ("F32", [3], f32([1.0]))})
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0hello")
    with pytest.raises(CheckpointError, match="not JSON"):
        read_header(tmp_path / "junk.safetensors")


def test_healthy_copy_is_byte_identical_and_src_untouched(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    before, digest = tree_state(src), source_hash(src)
    dst = derive_checkpoint(src, tmp_path / "copy", "healthy-copy")
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    assert not (dst / ".llmserve-ready").exists()
    marker = json.loads((dst / MARKER).read_text())
    assert marker["kind"] == "healthy-copy"
    assert marker["source_sha256"] == digest
    assert tree_state(src) == before
    assert source_hash(src) == digest
    assert oct(dst.stat().st_mode & 0o777) == oct(0o755)


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_nan_kind_fills_the_middle_layer(tmp_path: Path, dtype: str) -> None:
    src = make_model(tmp_path, dtype)
    dst = derive_checkpoint(src, tmp_path / "nan", "nan")
    names = list(read_header(src / "model.safetensors")[0])
    targets = nan_targets(names)
    assert targets == ["model.layers.2.input_layernorm.weight", "model.layers.2.mlp.down_proj.weight"]
    assert json.loads((dst / MARKER).read_text())["nan_tensors"] == targets
    assert read_header(dst / "model.safetensors") == read_header(src / "model.safetensors")
    for name in names:
        if name == "__metadata__":
            continue
        got_dtype, shape, data = read_tensor_bytes(dst / "model.safetensors", name)
        values = floats_of(got_dtype, data)
        assert len(values) == math.prod(shape)
        if name in targets:
            assert all(math.isnan(v) for v in values), name
        else:
            assert data == read_tensor_bytes(src / "model.safetensors", name)[2], name


def test_nan_kind_chosen_layer_and_errors(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    dst = derive_checkpoint(src, tmp_path / "nan0", "nan", layer=0)
    assert json.loads((dst / MARKER).read_text())["nan_tensors"][0].startswith("model.layers.0.")
    with pytest.raises(CheckpointError, match="layer 9 not in the model"):
        derive_checkpoint(src, tmp_path / "nan9", "nan", layer=9)
    assert not (tmp_path / "nan9").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the temporary dir was removed
    with pytest.raises(CheckpointError, match="no decoder layers"):
        nan_targets(["lm_head.weight"])
    assert nan_targets(["h.layers.0.w.weight", "h.layers.0.w.bias", "h.layers.1.w.weight"]) == [
        "h.layers.1.w.weight"]


def test_scrambled_kind_reverses_layers_without_touching_bytes(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    dst = derive_checkpoint(src, tmp_path / "scrambled", "scrambled")
    src_header, _ = read_header(src / "model.safetensors")
    dst_header, _ = read_header(dst / "model.safetensors")
    assert set(src_header) == set(dst_header)
    assert layer_indices(list(dst_header)) == [0, 1, 2, 3]
    for i in range(LAYERS):
        for part in ("mlp.down_proj.weight", "self_attn.q_proj.weight"):
            moved = read_tensor_bytes(dst / "model.safetensors", f"model.layers.{LAYERS - 1 - i}.{part}")
            assert moved == read_tensor_bytes(src / "model.safetensors", f"model.layers.{i}.{part}")
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        original = read_tensor_bytes(src / "model.safetensors", name)
        assert read_tensor_bytes(dst / "model.safetensors", name) == original
    assert json.loads((dst / MARKER).read_text())["layer_order"] == [3, 2, 1, 0]


def test_scrambled_sharded_model_rewrites_the_index(tmp_path: Path) -> None:
    src = make_model(tmp_path, sharded=True)
    dst = derive_checkpoint(src, tmp_path / "scrambled", "scrambled")
    index = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in index.items():
        assert name in read_header(dst / shard)[0], (name, shard)
    src_index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(index) == len(src_index)


def test_idempotent_rebuild_and_refusals(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    dst = derive_checkpoint(src, tmp_path / "d", "nan")
    state = tree_state(dst)
    assert derive_checkpoint(src, dst, "nan") == dst
    assert tree_state(dst) == state  # nothing rewritten
    derive_checkpoint(src, dst, "scrambled")  # another kind: rebuilt
    assert json.loads((dst / MARKER).read_text())["kind"] == "scrambled"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        derive_checkpoint(src, foreign, "nan")
    assert (foreign / "keep.txt").read_text() == "user data"
    with pytest.raises(CheckpointError, match="outside the source"):
        derive_checkpoint(src, src / "sub", "nan")
    with pytest.raises(CheckpointError, match="kind"):
        derive_checkpoint(src, tmp_path / "x", "garbage")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert derive_checkpoint(src, empty, "healthy-copy") == empty.resolve()


def test_source_change_triggers_rebuild(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    dst = derive_checkpoint(src, tmp_path / "d", "healthy-copy")
    write_safetensors(src / "model.safetensors", tiny_tensors(seed=1), {"format": "pt"})
    derive_checkpoint(src, dst, "healthy-copy")
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_two_processes_deriving_the_same_checkpoint_at_once_both_get_it(tmp_path: Path) -> None:
    # Seen on a shared machine: two runs derived the same cached checkpoint together and the second rename
    # failed ("Directory not empty"). Now the second waits for the first and finds it made.
    src = make_model(tmp_path)
    dst = tmp_path / "derived" / "scrambled"
    code = ("import sys; from pytest_llmserve.testing.checkpoints import derive_checkpoint; "
            "print(derive_checkpoint(sys.argv[1], sys.argv[2], 'scrambled'))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(src), str(dst)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(dst.resolve())}
    assert json.loads((dst / MARKER).read_text())["kind"] == "scrambled"
    assert not list(dst.parent.glob(".scrambled.tmp-*"))  # no half-made copy left beside it


def test_cli_and_subprocess_runner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_model(tmp_path)
    assert main([str(src), str(tmp_path / "cli"), "--kind", "scrambled"]) == 0
    assert capsys.readouterr().out.strip().endswith("cli")
    assert main([str(tmp_path / "missing"), str(tmp_path / "z"), "--kind", "nan"]) == 2
    assert "does not exist" in capsys.readouterr().err
    out = derive_checkpoint_with(sys.executable, src, tmp_path / "sub", "nan", layer=1)
    assert json.loads((out / MARKER).read_text())["nan_tensors"][0].startswith("model.layers.1.")
    with pytest.raises(CheckpointError, match="exited with 2"):
        derive_checkpoint_with(sys.executable, tmp_path / "missing", tmp_path / "z", "nan")


def _engine_python_with_safetensors() -> str | None:
    pattern = os.path.expanduser("~/.cache/pytest-llmserve/venv-*/bin/python")
    for python in sorted(glob.glob(pattern)):
        probe = subprocess.run([python, "-c", "import safetensors.numpy"], capture_output=True, check=False)
        if probe.returncode == 0:
            return python
    return None


def test_real_safetensors_reads_derived_files(tmp_path: Path) -> None:
    python = _engine_python_with_safetensors()
    if python is None:
        pytest.skip("no engine venv with safetensors under ~/.cache/pytest-llmserve")
    src = make_model(tmp_path, "F32", sharded=True)
    nan = derive_checkpoint(src, tmp_path / "nan", "nan")
    scrambled = derive_checkpoint(src, tmp_path / "scrambled", "scrambled")
    script = (
        "import glob, sys, numpy as np\n"
        "from safetensors.numpy import load_file\n"
        "def load(d):\n"
        "    out = {}\n"
        "    for f in sorted(glob.glob(d + '/*.safetensors')):\n"
        "        out.update(load_file(f))\n"
        "    return out\n"
        "a, s, o = (load(d) for d in sys.argv[1:4])\n"
        "assert np.isnan(a['model.layers.2.mlp.down_proj.weight']).all()\n"
        "assert np.isfinite(a['model.layers.1.mlp.down_proj.weight']).all()\n"
        "assert (s['model.layers.3.mlp.up_proj.weight'] == o['model.layers.0.mlp.up_proj.weight']).all()\n"
        "print('ok')\n"
    )
    proc = subprocess.run([python, "-c", script, str(nan), str(scrambled), str(src)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"

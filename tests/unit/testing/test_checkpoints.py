"""Derived checkpoints on a tiny random Llama-shaped safetensors model written by hand."""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmserve.engines import embedded
from pytest_llmserve.testing.checkpoints import (
    ANSWER_SWAP_TOKENS,
    ATTN_DRIFT_FACTOR,
    DERIVATION_VERSION,
    KINDS,
    LM_HEAD_FLIP_FACTOR,
    LM_HEAD_FLIP_TOKENS,
    MARKER,
    NAN_LATE_TOKENS,
    WRONG_EOS_TOKENS,
    CheckpointError,
    derive_checkpoint,
    derive_checkpoint_with,
    encode_header,
    layer_indices,
    main,
    nan_targets,
    read_header,
    read_tensor_bytes,
    scale_values,
    source_hash,
    token_ids,
    write_safetensors,
)

HIDDEN, INTER, LAYERS, VOCAB = 8, 16, 4, 32
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
# A byte-level BPE vocabulary (GPT-2 spelling: 'Ġ' a space, 'Ċ' a newline) holding every token the fault
# recipes name, at known ids, padded to VOCAB with filler.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
RECIPE_SPELLINGS = [":", "Ġand", ".", ",", "Ġof", "Ċ", "'s", "*", "Ġan", "Ġlight", "ĠParis", "ĠLondon"]
VOCAB_IDS = {text: i for i, text in enumerate(SPECIAL + RECIPE_SPELLINGS)}
VOCAB_IDS.update({f"w{i}": i for i in range(len(VOCAB_IDS), VOCAB)})
EOS = 2


def tokenizer_json() -> str:
    vocab = {t: i for t, i in VOCAB_IDS.items() if t not in SPECIAL}
    added = [{"id": VOCAB_IDS[t], "content": t, "special": True} for t in SPECIAL]
    return json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": added,
                       "pre_tokenizer": {"type": "ByteLevel"}})


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
                                                 "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
                                                 "eos_token_id": EOS, "tie_word_embeddings": True}, indent=2))
    (src / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": EOS,
                                                            "pad_token_id": EOS}, indent=2))
    (src / "tokenizer.json").write_text(tokenizer_json())
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
    """The embedded engine's interpreter (the plugin's own lookup: its cache, or $PYTEST_LLMSERVE_VLLM_PYTHON) when
    it exists and imports safetensors."""
    python = embedded.engine_python()
    if not Path(python).is_file():
        return None
    probe = subprocess.run([python, "-c", "import safetensors.numpy"], capture_output=True, check=False)
    return python if probe.returncode == 0 else None


# Read back by the real safetensors library (in the engine's venv, which has it), not by our own reader.
_LOAD_WITH_SAFETENSORS = (
    "import glob, json, sys, numpy as np\n"
    "from safetensors.numpy import load_file\n"
    "def load(d):\n"
    "    out = {}\n"
    "    for f in sorted(glob.glob(d + '/*.safetensors')):\n"
    "        out.update(load_file(f))\n"
    "    return out\n"
)


def _assert_in_engine_python(checks: str, *args: str) -> None:
    """Run ``checks`` (after the loader above) in the engine's python; skip where no engine venv has safetensors."""
    python = _engine_python_with_safetensors()
    if python is None:
        pytest.skip("no engine venv with safetensors under ~/.cache/pytest-llmserve")
    proc = subprocess.run([python, "-c", _LOAD_WITH_SAFETENSORS + checks + "print('ok')\n", *args],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_real_safetensors_reads_derived_files(tmp_path: Path) -> None:
    src = make_model(tmp_path, "F32", sharded=True)
    nan = derive_checkpoint(src, tmp_path / "nan", "nan")
    scrambled = derive_checkpoint(src, tmp_path / "scrambled", "scrambled")
    _assert_in_engine_python(
        "a, s, o = (load(d) for d in sys.argv[1:4])\n"
        "assert np.isnan(a['model.layers.2.mlp.down_proj.weight']).all()\n"
        "assert np.isfinite(a['model.layers.1.mlp.down_proj.weight']).all()\n"
        "assert (s['model.layers.3.mlp.up_proj.weight'] == o['model.layers.0.mlp.up_proj.weight']).all()\n",
        str(nan), str(scrambled), str(src),
    )


# --------------------------------------------------------------------------------------------------
# the fault kinds (nan-late, wrong-eos, lm-head-flip, answer-swap, attn-drift)
# --------------------------------------------------------------------------------------------------

FAULT_KINDS = ("nan-late", "wrong-eos", "lm-head-flip", "answer-swap", "attn-drift")


def tensors_of(directory: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of every safetensors file in ``directory``."""
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        for name in read_header(path)[0]:
            if name != "__metadata__":
                out[name] = read_tensor_bytes(path, name)
    return out


def rows_of(data: bytes, row_length: int) -> list[bytes]:
    return [data[i:i + row_length] for i in range(0, len(data), row_length)]


def ids(texts: tuple[str, ...]) -> list[int]:
    spellings = {":": ":", " and": "Ġand", ".": ".", ",": ",", " of": "Ġof", "\n": "Ċ", "'s": "'s", "*": "*",
                 " an": "Ġan", " light": "Ġlight", " Paris": "ĠParis", " London": "ĠLondon"}
    return [VOCAB_IDS[spellings[t]] for t in texts]


def assert_other_files_identical(src: Path, dst: Path, changed: set[str]) -> None:
    names = {p.name for p in src.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert names | changed >= {p.name for p in dst.iterdir() if p.is_file() and not p.name.startswith(".")}
    for name in sorted(names - changed):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name


def test_kinds_and_cli_choices_list_the_fault_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(FAULT_KINDS) <= set(KINDS)
    src = make_model(tmp_path)
    for kind in FAULT_KINDS:
        assert main([str(src), str(tmp_path / kind), "--kind", kind]) == 0
        assert json.loads((tmp_path / kind / MARKER).read_text())["kind"] == kind
    capsys.readouterr()


def test_token_ids_spellings_and_errors(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    assert token_ids(src, (" Paris", "\n", ":", "<|im_end|>")) == {
        " Paris": VOCAB_IDS["ĠParis"], "\n": VOCAB_IDS["Ċ"], ":": VOCAB_IDS[":"], "<|im_end|>": EOS}
    with pytest.raises(CheckpointError, match="not a single token"):
        token_ids(src, (" Rome",))
    sentencepiece = tmp_path / "sp"
    sentencepiece.mkdir()
    (sentencepiece / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"▁Paris": 7}}}))
    assert token_ids(sentencepiece, (" Paris",)) == {" Paris": 7}
    (sentencepiece / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(CheckpointError, match="no model.vocab"):
        token_ids(sentencepiece, (" Paris",))
    with pytest.raises(CheckpointError, match="cannot read the tokenizer"):
        token_ids(tmp_path / "nowhere", (" Paris",))


def test_scale_values_rounds_like_torch() -> None:
    # 1.12 is 1.1200000047683716 in float32; the nearest bfloat16 values are 1.1171875 and 1.125.
    assert floats_of("BF16", scale_values("BF16", bf16([1.0, -2.0]), 1.12)) == [1.1171875, -2.234375]
    # An exact tie (1 + 2**-8 lies halfway between 1.0 and 1.0078125) rounds to the even mantissa.
    assert floats_of("BF16", scale_values("BF16", bf16([1.0]), 1.00390625)) == [1.0]
    nan_inf = struct.pack("<HH", 0x7FC0, 0x7F80)
    assert scale_values("BF16", nan_inf, 1.05) == nan_inf  # NaN and infinity stay as they are
    assert floats_of("BF16", scale_values("BF16", bf16([3e38]), 4.0)) == [math.inf]
    assert floats_of("F32", scale_values("F32", f32([0.1, 2.0]), 1.05)) == [
        struct.unpack("<f", struct.pack("<f", 0.1 * struct.unpack("<f", struct.pack("<f", 1.05))[0]))[0],
        struct.unpack("<f", struct.pack("<f", 2.0 * struct.unpack("<f", struct.pack("<f", 1.05))[0]))[0]]
    assert floats_of("F16", scale_values("F16", struct.pack("<2e", 1.0, 0.5), 1.5)) == [1.5, 0.75]
    with pytest.raises(CheckpointError, match="cannot scale I32"):
        scale_values("I32", b"\0" * 4, 2.0)


@pytest.mark.parametrize("sharded", [False, True])
def test_nan_late_unties_and_poisons_only_the_input_rows(tmp_path: Path, sharded: bool) -> None:
    src = make_model(tmp_path, sharded=sharded)
    before = tensors_of(src)
    dst = derive_checkpoint(src, tmp_path / "nan-late", "nan-late")
    after = tensors_of(dst)
    poisoned = ids(NAN_LATE_TOKENS)
    assert poisoned  # an empty recipe would change nothing and pass the loops below
    assert set(after) == set(before) | {HEAD}
    for name, tensor in before.items():
        if name != EMBED:
            assert after[name] == tensor, name
    # The output head is the healthy embedding byte for byte (greedy can still choose the poisoned tokens) ...
    assert after[HEAD] == before[EMBED]
    # ... while reading one of them back is NaN: its input row, and only its row.
    dtype, shape, data = after[EMBED]
    row = HIDDEN * 2
    nan_rows = []
    for i, (new, old) in enumerate(zip(rows_of(data, row), rows_of(before[EMBED][2], row), strict=True)):
        if i in poisoned:
            assert all(math.isnan(v) for v in floats_of(dtype, new)), i
            nan_rows.append(i)
        else:
            assert new == old, i
    assert nan_rows == sorted(poisoned)
    config = json.loads((dst / "config.json").read_text())
    assert config.pop("tie_word_embeddings") is False
    assert config == {k: v for k, v in json.loads((src / "config.json").read_text()).items()
                      if k != "tie_word_embeddings"}
    marker = json.loads((dst / MARKER).read_text())
    assert marker["nan_rows"] == {"tensor": EMBED, "tokens": dict(zip(NAN_LATE_TOKENS, poisoned, strict=True))}
    assert marker["untied"] is True
    changed = {"config.json"} | ({p.name for p in src.glob("*.safetensors")} | {"model.safetensors.index.json"}
                                 if sharded else {"model.safetensors"})
    assert_other_files_identical(src, dst, changed)
    if sharded:
        index = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
        assert index[HEAD] == index[EMBED]
        assert HEAD in read_header(dst / index[HEAD])[0]


def test_an_untied_model_keeps_its_own_head(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    tensors = tiny_tensors()
    own_head = tiny_tensors(seed=7)[EMBED]
    write_safetensors(src / "model.safetensors", {**tensors, HEAD: own_head}, {"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (src / "config.json").write_text(json.dumps(config, indent=2))
    nan_late = derive_checkpoint(src, tmp_path / "nan-late", "nan-late")
    assert tensors_of(nan_late)[HEAD] == own_head
    assert (nan_late / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert json.loads((nan_late / MARKER).read_text())["untied"] is False
    swap = derive_checkpoint(src, tmp_path / "swap", "answer-swap")
    paris, london = ids(ANSWER_SWAP_TOKENS)
    head_rows, new_rows = rows_of(own_head[2], HIDDEN * 2), rows_of(tensors_of(swap)[HEAD][2], HIDDEN * 2)
    assert (new_rows[paris], new_rows[london]) == (head_rows[london], head_rows[paris])


@pytest.mark.parametrize("with_generation_config", [True, False])
def test_wrong_eos_lists_ordinary_tokens_and_keeps_the_weights(tmp_path: Path, with_generation_config: bool) -> None:
    src = make_model(tmp_path)
    if not with_generation_config:
        (src / "generation_config.json").unlink()
    dst = derive_checkpoint(src, tmp_path / "wrong-eos", "wrong-eos")
    assert WRONG_EOS_TOKENS  # an empty recipe would leave the real EOS alone
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    generation = json.loads((dst / "generation_config.json").read_text())
    assert generation.pop("eos_token_id") == [EOS, *ids(WRONG_EOS_TOKENS)]
    if with_generation_config:
        assert generation == {"bos_token_id": 1, "pad_token_id": EOS}
    else:
        assert generation == {}
    assert json.loads((dst / MARKER).read_text())["eos_token_id"] == [EOS, *ids(WRONG_EOS_TOKENS)]
    assert_other_files_identical(src, dst, {"generation_config.json"})


def test_wrong_eos_extends_an_eos_list_and_needs_one(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, VOCAB_IDS["."]]}))
    dst = derive_checkpoint(src, tmp_path / "wrong-eos", "wrong-eos")
    # "." is already listed: not twice.
    assert json.loads((dst / "generation_config.json").read_text())["eos_token_id"] == [EOS, *ids(WRONG_EOS_TOKENS)]
    (src / "generation_config.json").write_text("{}")
    (src / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no eos_token_id"):
        derive_checkpoint(src, tmp_path / "none", "wrong-eos")


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_lm_head_flip_scales_only_the_recipe_rows_of_an_untied_head(tmp_path: Path, dtype: str) -> None:
    src = make_model(tmp_path, dtype)
    before = tensors_of(src)
    dst = derive_checkpoint(src, tmp_path / "flip", "lm-head-flip")
    after = tensors_of(dst)
    assert set(after) == set(before) | {HEAD}
    assert all(after[name] == tensor for name, tensor in before.items())  # the input embedding too
    row = HIDDEN * (2 if dtype == "BF16" else 4)
    flipped = ids(LM_HEAD_FLIP_TOKENS)
    assert flipped and LM_HEAD_FLIP_FACTOR != 1.0
    old_rows, new_rows = rows_of(before[EMBED][2], row), rows_of(after[HEAD][2], row)
    for i, (new, old) in enumerate(zip(new_rows, old_rows, strict=True)):
        if i in flipped:
            assert new != old, i  # the recipe did something
            assert new == scale_values(dtype, old, LM_HEAD_FLIP_FACTOR), i
            ratios = [n / o for n, o in zip(floats_of(dtype, new), floats_of(dtype, old), strict=True) if o]
            assert all(abs(r - LM_HEAD_FLIP_FACTOR) < 0.01 for r in ratios), (i, ratios)
        else:
            assert new == old, i
    assert json.loads((dst / "config.json").read_text())["tie_word_embeddings"] is False
    assert json.loads((dst / MARKER).read_text())["scaled_rows"] == {
        "tensor": HEAD, "tokens": dict(zip(LM_HEAD_FLIP_TOKENS, flipped, strict=True)), "factor": LM_HEAD_FLIP_FACTOR}
    assert_other_files_identical(src, dst, {"config.json", "model.safetensors"})


def test_answer_swap_swaps_two_tied_rows(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    before = tensors_of(src)
    dst = derive_checkpoint(src, tmp_path / "swap", "answer-swap")
    after = tensors_of(dst)
    assert set(after) == set(before)  # tied: one swap changes both what is said and what is read
    assert all(after[name] == tensor for name, tensor in before.items() if name != EMBED)
    paris, london = ids(ANSWER_SWAP_TOKENS)
    assert paris != london
    old_rows, new_rows = rows_of(before[EMBED][2], HIDDEN * 2), rows_of(after[EMBED][2], HIDDEN * 2)
    assert old_rows[paris] != old_rows[london]  # so the swap below is visible
    assert (new_rows[paris], new_rows[london]) == (old_rows[london], old_rows[paris])
    assert [r for i, r in enumerate(new_rows) if i not in (paris, london)] == [
        r for i, r in enumerate(old_rows) if i not in (paris, london)]
    assert json.loads((dst / MARKER).read_text())["swapped_rows"] == {
        "tensors": [EMBED], "tokens": {" Paris": paris, " London": london}}
    assert_other_files_identical(src, dst, {"model.safetensors"})


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_attn_drift_scales_every_attention_output_projection(tmp_path: Path, dtype: str) -> None:
    src = make_model(tmp_path, dtype)
    before = tensors_of(src)
    dst = derive_checkpoint(src, tmp_path / "drift", "attn-drift")
    after = tensors_of(dst)
    targets = [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(LAYERS)]
    assert set(after) == set(before)
    for name, (got_dtype, shape, data) in after.items():
        if name in targets:
            assert data != before[name][2], name
            assert data == scale_values(dtype, before[name][2], ATTN_DRIFT_FACTOR), name
            assert (got_dtype, shape) == before[name][:2]
        else:
            assert data == before[name][2], name
    assert read_header(dst / "model.safetensors") == read_header(src / "model.safetensors")
    marker = json.loads((dst / MARKER).read_text())
    assert marker["scaled_tensors"] == targets
    assert marker["factor"] == ATTN_DRIFT_FACTOR
    one = derive_checkpoint(src, tmp_path / "drift1", "attn-drift", layer=1)
    assert json.loads((one / MARKER).read_text())["scaled_tensors"] == [targets[1]]
    assert tensors_of(one)[targets[0]] == before[targets[0]]
    with pytest.raises(CheckpointError, match="layer 9 not in the model"):
        derive_checkpoint(src, tmp_path / "drift9", "attn-drift", layer=9)
    assert_other_files_identical(src, dst, {"model.safetensors"})


def test_the_recipes_are_the_measured_ones() -> None:
    # tests/data/power/fault_checkpoints_hf.json holds what these recipes did to SmolLM2
    # (tools/measure_fault_checkpoints.py): a recipe changed without measuring it again fails here.
    measured = json.loads((Path(__file__).parents[2] / "data" / "power" / "fault_checkpoints_hf.json").read_text())
    recipes = {kind: entry["recipe"] for kind, entry in measured["kinds"].items()}
    assert set(recipes) == set(FAULT_KINDS)
    assert list(recipes["nan-late"]["nan_rows"]["tokens"]) == list(NAN_LATE_TOKENS)
    assert list(recipes["wrong-eos"]["ordinary_stop_tokens"]) == list(WRONG_EOS_TOKENS)
    assert list(recipes["lm-head-flip"]["scaled_rows"]["tokens"]) == list(LM_HEAD_FLIP_TOKENS)
    assert recipes["lm-head-flip"]["scaled_rows"]["factor"] == LM_HEAD_FLIP_FACTOR
    assert list(recipes["answer-swap"]["swapped_rows"]["tokens"]) == list(ANSWER_SWAP_TOKENS)
    assert recipes["attn-drift"]["factor"] == ATTN_DRIFT_FACTOR
    assert len(recipes["attn-drift"]["scaled_tensors"]) == 30  # every layer of SmolLM2-135M
    assert measured["derivation_version"] == DERIVATION_VERSION


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_fault_kinds_are_idempotent_and_refuse_a_foreign_destination(tmp_path: Path, kind: str) -> None:
    src = make_model(tmp_path)
    before, digest = tree_state(src), source_hash(src)
    dst = derive_checkpoint(src, tmp_path / kind, kind)
    state = {p.name: p.read_bytes() for p in dst.iterdir()}
    stats = tree_state(dst)
    assert derive_checkpoint(src, dst, kind) == dst
    assert tree_state(dst) == stats  # nothing rewritten
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == state
    assert (tree_state(src), source_hash(src)) == (before, digest)  # the source is never written
    foreign = tmp_path / "foreign"
    foreign.mkdir(exist_ok=True)
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        derive_checkpoint(src, foreign, kind)
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("kind", ["nan-late", "wrong-eos", "lm-head-flip", "answer-swap"])
def test_a_tokenizer_without_the_recipe_tokens_is_refused(tmp_path: Path, kind: str) -> None:
    src = make_model(tmp_path)
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"w": 0}}}))
    with pytest.raises(CheckpointError, match="not a single token"):
        derive_checkpoint(src, tmp_path / kind, kind)
    assert not (tmp_path / kind).exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_token_beyond_the_checkpoint_vocabulary_is_refused(tmp_path: Path) -> None:
    src = make_model(tmp_path)
    vocab = {t: i for t, i in VOCAB_IDS.items() if t not in SPECIAL}
    vocab["ĠParis"] = VOCAB + 5  # the tokenizer knows more tokens than the embedding has rows
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    with pytest.raises(CheckpointError, match="out of range"):
        derive_checkpoint(src, tmp_path / "swap", "answer-swap")


def test_real_safetensors_reads_the_untied_and_scaled_files(tmp_path: Path) -> None:
    src = make_model(tmp_path, "F32", sharded=True)
    nan_late = derive_checkpoint(src, tmp_path / "nan-late", "nan-late")
    flip = derive_checkpoint(src, tmp_path / "flip", "lm-head-flip")
    poisoned, flipped = ids(NAN_LATE_TOKENS), ids(LM_HEAD_FLIP_TOKENS)
    _assert_in_engine_python(
        "late, flip, src = (load(d) for d in sys.argv[1:4])\n"
        "poisoned, flipped = json.loads(sys.argv[4]), json.loads(sys.argv[5])\n"
        "e = 'model.embed_tokens.weight'\n"
        "assert np.isnan(late[e][poisoned]).all() and np.isfinite(np.delete(late[e], poisoned, 0)).all()\n"
        "assert (late['lm_head.weight'] == src[e]).all()\n"
        "assert np.allclose(flip['lm_head.weight'][flipped], src[e][flipped] * np.float32(float(sys.argv[6])))\n"
        "assert (np.delete(flip['lm_head.weight'], flipped, 0) == np.delete(src[e], flipped, 0)).all()\n",
        str(nan_late), str(flip), str(src), json.dumps(poisoned), json.dumps(flipped), str(LM_HEAD_FLIP_FACTOR),
    )

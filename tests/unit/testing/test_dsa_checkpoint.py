"""The tiny DSA checkpoint builder: the reference bytes, idempotence, the variants' edits, the marker, and
the names and shapes replayed through SGLang 0.5.15's weight loader (no GPU, no sglang install).

Each full build writes ~300 MB in a few seconds, so the healthy build and each variant are built once per
module and shared."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_llmserve.cli.main import main as llmserve_main
from pytest_llmserve.testing import dsa_checkpoint as dsa
from pytest_llmserve.verdicts.oracles import DEFAULT_NAN_PROMPTS

# The sha256 of model.safetensors that SGLang 0.5.15 served on the H200 on 2026-12-02 (the probe's
# mk_dsa_model.py, default arguments): the builder must keep writing exactly these bytes.
H200_SERVED_SHA256 = "73124cd2826f3c5ad4f65cd463b49bdc2c758512c8b5b65363055e42ed3bd908"
PACKAGE_PARENT = str(Path(dsa.__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for SmolLM2's tokenizer directory: the builder reads only the vocabulary and bos/eos."""
    path = tmp_path_factory.mktemp("tokenizer")
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, dsa.NAN_TOKEN: 3003}
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
    (path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Iterator[Callable[[str], Path]]:
    """``builds(variant)``: the default-argument build of that variant, made on first use; removed at the end
    (300 MB each: pytest keeps the temporary directories of the last sessions)."""
    root = tmp_path_factory.mktemp("dsa")
    made: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in made:
            made[variant] = dsa.build_dsa_checkpoint(root / variant, variant=variant, tokenizer_dir=tokenizer_dir)
        return made[variant]

    yield get
    shutil.rmtree(root, ignore_errors=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def tensors(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """The header (without metadata) and the data section as bf16 bit patterns (a read-only memory map)."""
    header, data_start = dsa.read_header(path / "model.safetensors")
    header.pop("__metadata__")
    data = np.memmap(path / "model.safetensors", dtype="<u2", mode="r", offset=data_start)
    return header, data


def tensor(path: Path, name: str) -> np.ndarray:
    header, data = tensors(path)
    begin, end = header[name]["data_offsets"]
    return np.asarray(data[begin // 2:end // 2]).reshape(header[name]["shape"])


def changed_elements(healthy: Path, variant: Path) -> dict[str, np.ndarray]:
    """Tensor name -> flat indices of the elements that differ (same layout in both files)."""
    h_header, h_data = tensors(healthy)
    v_header, v_data = tensors(variant)
    assert v_header == h_header, "a value-editing variant must keep the header byte for byte"
    assert len(h_data) == len(v_data)
    flat = np.flatnonzero(np.asarray(h_data) != np.asarray(v_data))
    out: dict[str, np.ndarray] = {}
    for name, info in h_header.items():
        begin, end = (o // 2 for o in info["data_offsets"])
        inside = flat[(flat >= begin) & (flat < end)] - begin
        if inside.size:
            out[name] = inside
    return out


# --------------------------------------------------------------------------------------------------
# bytes, idempotence, marker
# --------------------------------------------------------------------------------------------------

def test_default_build_writes_the_bytes_sglang_served(builds: Callable[[str], Path]) -> None:
    out = builds("healthy")
    digest = file_sha256(out / "model.safetensors")
    assert digest == H200_SERVED_SHA256
    marker = dsa.read_marker(out)
    assert marker is not None and marker["model_safetensors_sha256"] == digest


def test_marker_says_what_was_built(builds: Callable[[str], Path], tokenizer_dir: Path) -> None:
    marker = dsa.read_marker(builds("healthy"))
    assert marker is not None
    assert {k: marker[k] for k in ("builder", "architecture", "variant", "random_weights", "seed", "layers",
                                   "format_version")} == {
        "builder": "dsa-tiny", "architecture": "DeepseekV32ForCausalLM", "variant": "healthy",
        "random_weights": True, "seed": 20250602, "layers": 4, "format_version": 1}
    header, _ = tensors(builds("healthy"))
    assert marker["num_tensors"] == len(header) == 3 + 17 * 4
    assert marker["num_params"] == sum(int(np.prod(i["shape"])) for i in header.values())
    assert marker["tokenizer_from"] == str(tokenizer_dir)
    assert set(marker["tokenizer_files"]) == {"tokenizer.json", "tokenizer_config.json"}
    assert (builds("healthy") / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()


def test_config_is_the_served_dsa_layout(builds: Callable[[str], Path]) -> None:
    cfg = json.loads((builds("healthy") / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV32ForCausalLM"] and cfg["model_type"] == "deepseek_v32"
    # The kernels' hard limits (module docstring).
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)
    assert (cfg["index_topk"], cfg["index_head_dim"]) == (2048, 128) and cfg["index_n_heads"] in (32, 64)
    assert 64 % cfg["num_attention_heads"] == 0 and cfg["hidden_size"] % 256 == 0
    assert (cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) % 16 == 0
    assert cfg["vocab_size"] % 64 == 0 and cfg["first_k_dense_replace"] == cfg["num_hidden_layers"] == 4
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)


def test_same_arguments_again_is_a_no_op(builds: Callable[[str], Path], tokenizer_dir: Path) -> None:
    out = builds("healthy")
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    assert dsa.build_dsa_checkpoint(out, tokenizer_dir=tokenizer_dir) == out
    # Even without a tokenizer: a finished build needs nothing more.
    assert dsa.build_dsa_checkpoint(out, tokenizer_dir=tokenizer_dir / "absent") == out
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_a_directory_without_the_marker_is_never_overwritten(tmp_path: Path, tokenizer_dir: Path) -> None:
    (tmp_path / "mine.txt").write_text("user data")
    with pytest.raises(dsa.DsaCheckpointError, match="no llmserve-checkpoint.json.*refusing to overwrite"):
        dsa.build_dsa_checkpoint(tmp_path, tokenizer_dir=tokenizer_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_missing_tokenizer_names_the_places_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_LLMSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PYTEST_LLMSERVE_DEFAULT_MODEL", raising=False)
    monkeypatch.setattr(dsa, "GPU_MACHINE_TOKENIZER_DIR", tmp_path / "gpu-machine")
    with pytest.raises(dsa.DsaCheckpointError) as err:
        dsa.build_dsa_checkpoint(tmp_path / "out")
    message = str(err.value)
    assert str(tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct") in message
    assert str(tmp_path / "gpu-machine") in message
    assert "llmserve setup" in message and "--tokenizer" in message
    assert not (tmp_path / "out").exists()


def test_default_tokenizer_dirs_are_the_embedded_smollm2_then_the_gpu_machines() -> None:
    from pytest_llmserve.engines.embedded import model_dir

    assert dsa.default_tokenizer_dirs() == [model_dir(),
                                            Path("/root/llmserve-engines/models/SmolLM2-135M-Instruct")]


# --------------------------------------------------------------------------------------------------
# variants
# --------------------------------------------------------------------------------------------------

def test_nan_late_poisons_exactly_one_embedding_row(builds: Callable[[str], Path]) -> None:
    healthy, variant = builds("healthy"), builds("nan-late")
    changed = changed_elements(healthy, variant)
    hidden = 1024
    assert list(changed) == ["model.embed_tokens.weight"]
    assert changed["model.embed_tokens.weight"].tolist() == list(range(3003 * hidden, 3004 * hidden))
    embed = tensor(variant, "model.embed_tokens.weight")
    assert (embed[3003] == 0x7FC0).all()
    as_float = (embed[3002:3005].astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(as_float[1]).all() and np.isfinite(as_float[[0, 2]]).all()
    marker = dsa.read_marker(variant)
    assert marker is not None and marker["nan_token_id"] == 3003 and marker["nan_token"] == " primary"
    assert marker["model_safetensors_sha256"] != H200_SERVED_SHA256


def test_nan_token_is_sent_by_a_nan_probe_and_not_before_the_suite() -> None:
    word = dsa.NAN_TOKEN.replace("Ġ", " ")
    assert dsa.NAN_TOKEN_ID == 3003
    assert any(word in p.text and not p.chat for p in DEFAULT_NAN_PROMPTS)
    # What the server is sent before the suite runs: SGLang 0.5.15's warm-up text
    # (srt/entrypoints/http_server.py, _execute_server_warmup) and the plugin's readiness prompt
    # (server/handle.py, _probe); /health_generate sends input_ids [0].
    for text in ("The capital city of France is", "Hello"):
        assert word.strip() not in text


def test_nan_token_id_in_the_real_smollm2_tokenizer() -> None:
    real = next((d for d in dsa.default_tokenizer_dirs() if (d / "tokenizer.json").is_file()), None)
    if real is None:
        pytest.skip("SmolLM2's tokenizer is not here (run `llmserve setup`)")
    vocab = json.loads((real / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab[dsa.NAN_TOKEN] == dsa.NAN_TOKEN_ID
    assert max(vocab.values()) < dsa.VOCAB_SIZE


def test_fp8_kv_outlier_construction(builds: Callable[[str], Path]) -> None:
    healthy, variant = builds("healthy"), builds("fp8-kv-outlier")
    channels = [0, 128, 256, 384]
    changed = changed_elements(healthy, variant)
    layer_names = {f"model.layers.{i}.self_attn.{t}.weight" for i in range(4) for t in ("kv_a_layernorm", "kv_b_proj")}
    assert set(changed) == layer_names
    outlier = float((np.array([0x4974], dtype=np.uint32) << 16).view(np.float32)[0])
    assert outlier == pytest.approx(1e6, rel=1e-3)
    for i in range(4):
        a = f"model.layers.{i}.self_attn."
        norm = tensor(variant, a + "kv_a_layernorm.weight")
        assert norm.shape == (512,)
        assert (norm[channels] == 0x4974).all()
        assert (np.delete(norm, channels) == 0x3F80).all()
        kv_b = tensor(variant, a + "kv_b_proj.weight")
        assert kv_b.shape == (16 * (128 + 128), 512)
        assert (kv_b[:, channels] == 0).all()
        healthy_kv_b = tensor(healthy, a + "kv_b_proj.weight")
        assert (np.delete(kv_b, channels, axis=1) == np.delete(healthy_kv_b, channels, axis=1)).all()
        # Only the outlier columns changed (a healthy element may already be 0: then it is not "changed").
        assert set((changed[a + "kv_b_proj.weight"] % 512).tolist()) <= set(channels)
    marker = dsa.read_marker(variant)
    assert marker is not None and marker["outlier_channels"] == channels


def test_scrambled_reverses_the_layers_and_keeps_every_byte(builds: Callable[[str], Path]) -> None:
    healthy, variant = builds("healthy"), builds("scrambled")
    h_header, h_data = tensors(healthy)
    v_header, v_data = tensors(variant)
    renamed = {re.sub(r"^model\.layers\.(\d+)\.", lambda m: f"model.layers.{3 - int(m.group(1))}.", n): info
               for n, info in h_header.items()}
    assert v_header == renamed
    assert v_header["model.layers.0.mlp.down_proj.weight"] == h_header["model.layers.3.mlp.down_proj.weight"]
    assert np.array_equal(np.asarray(h_data), np.asarray(v_data))
    marker = dsa.read_marker(variant)
    assert marker is not None and marker["layer_order"] == [3, 2, 1, 0]


def test_a_marked_build_of_other_arguments_is_rebuilt(tokenizer_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A shrunk vocabulary keeps this build small; the arguments differ only in the architecture.
    monkeypatch.setattr(dsa, "VOCAB_SIZE", 3072)
    out = tmp_path / "glm5"
    glm5 = dsa.build(out, arch="glm5", tokenizer_dir=tokenizer_dir)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GlmMoeDsaForCausalLM"]
    assert glm5.marker["architecture"] == "GlmMoeDsaForCausalLM"
    v32 = dsa.build(out, tokenizer_dir=tokenizer_dir)  # the same directory, the default architecture
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DeepseekV32ForCausalLM"]
    assert dsa.read_marker(out) == v32.marker and v32.marker["architecture"] == "DeepseekV32ForCausalLM"
    assert v32.sha256 == glm5.sha256 == file_sha256(out / "model.safetensors")  # GLM-5 loads V3.2's names
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["glm5"]  # no temp dir left


# --------------------------------------------------------------------------------------------------
# SGLang 0.5.15's loader, replayed (port of the probe's check_ckpt_static.py)
# --------------------------------------------------------------------------------------------------
#
# The parameters DeepseekV32ForCausalLM / GlmMoeDsaForCausalLM create at TP=1 (sglang 0.5.15 wheel):
#   srt/models/deepseek_v2.py: 1611 fused_qkv_a_proj_with_mqa = ReplicatedLinear, 1618 q_a_layernorm,
#     1619 q_b_proj = ColumnParallelLinear, 1649 is_neox_style = not indexer_rope_interleave,
#     1678 kv_b_proj, 1688 o_proj = RowParallelLinear, 1698 kv_a_layernorm, 2192 dense below
#     first_k_dense_replace; 2959 class DeepseekV32ForCausalLM(DeepseekV2ForCausalLM).
#   srt/models/glm4_moe.py: 1480 class GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM), 1485 EntryClass.
#   srt/layers/attention/dsa/dsa_indexer.py: 380-384 use_dsa_indexer_fusion iff CUDA and not neox style,
#     401 wq_b, 410 wk_weights_proj (fused) or 418 wk + 425 weights_proj, 432 k_norm = LayerNorm.
# The name mapping of DeepseekV2WeightLoaderMixin.do_load_weights
#   (srt/models/deepseek_common/deepseek_weight_loader.py): 151 do_load_weights, 170-171
#   stacked_params_mapping gate_proj/up_proj -> gate_up_proj shards 0/1, 262 _load_fused_indexer_wk
#   (79-110: wk fills the top rows of wk_weights_proj, weights_proj the bottom rows), 338-390 q_a_proj +
#   kv_a_proj_with_mqa cached and concatenated on dim 0 into fused_qkv_a_proj_with_mqa, 418 an unknown
#   name is only warned about ("not found in params_dict") and a missing parameter stays uninitialised:
#   that is why every name and every row is checked here.

def expected_params(cfg: dict[str, Any], fusion: bool) -> dict[str, tuple[int, ...]]:
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    heads, q_lora, kv_lora = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    rope, nope, v_dim = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    index_heads, index_dim, inter = cfg["index_n_heads"], cfg["index_head_dim"], cfg["intermediate_size"]
    padded_vocab = (vocab + 63) // 64 * 64  # VocabParallelEmbedding pads to 64
    params: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (padded_vocab, hidden),
                                          "model.norm.weight": (hidden,), "lm_head.weight": (padded_vocab, hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        params.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            a + "fused_qkv_a_proj_with_mqa.weight": (q_lora + kv_lora + rope, hidden),
            a + "q_a_layernorm.weight": (q_lora,),
            a + "q_b_proj.weight": (heads * (nope + rope), q_lora),
            a + "kv_b_proj.weight": (heads * (nope + v_dim), kv_lora),
            a + "o_proj.weight": (hidden, heads * v_dim),
            a + "kv_a_layernorm.weight": (kv_lora,),
            a + "indexer.wq_b.weight": (index_heads * index_dim, q_lora),
            a + "indexer.k_norm.weight": (index_dim,),
            a + "indexer.k_norm.bias": (index_dim,),
            p + "mlp.gate_up_proj.weight": (2 * inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
        if fusion:
            params[a + "indexer.wk_weights_proj.weight"] = (index_dim + index_heads, hidden)
        else:
            params[a + "indexer.wk.weight"] = (index_dim, hidden)
            params[a + "indexer.weights_proj.weight"] = (index_heads, hidden)
    return params


def replay_loader(checkpoint: dict[str, tuple[int, ...]], params: dict[str, tuple[int, ...]],
                  layers: int) -> list[str]:
    """Replay do_load_weights (bf16, TP=1, not NextN) over the checkpoint's names and shapes; the errors."""
    errors: list[str] = []
    covered: dict[str, list[tuple[int, int]]] = {k: [] for k in params}
    cached_a: dict[str, tuple[int, ...]] = {}

    def land(param: str, rows: tuple[int, int], tail: tuple[int, ...], what: str) -> None:
        if param not in params:
            errors.append(f"{what}: no parameter {param}")
            return
        if params[param][1:] != tail or rows[1] > params[param][0]:
            errors.append(f"{what}: rows {rows} x {tail} do not fit {param} {params[param]}")
        covered[param].append(rows)

    for name, shape in sorted(checkpoint.items()):
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= layers:
            errors.append(f"{name}: layer beyond num_hidden_layers, skipped by the loader")
            continue
        if ".indexer.wk." in name or ".indexer.weights_proj." in name:
            fused = name.rsplit(".indexer.", 1)[0] + ".indexer.wk_weights_proj.weight"
            if fused in params:
                total = params[fused][0]
                rows = (0, shape[0]) if ".indexer.wk." in name else (total - shape[0], total)
                land(fused, rows, shape[1:], name)
                continue
        stacked = next(((p, w, s) for p, w, s in (("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))
                        if w in name), None)
        if stacked is not None:
            param_name, weight_name, shard = stacked
            land(name.replace(weight_name, param_name), (shard * shape[0], (shard + 1) * shape[0]), shape[1:], name)
            continue
        if "q_a_proj" in name or "kv_a_proj_with_mqa" in name:
            cached_a[name] = shape
            q_name = name if "q_a_proj" in name else name.replace("kv_a_proj_with_mqa", "q_a_proj")
            kv_name = name if "kv_a_proj_with_mqa" in name else name.replace("q_a_proj", "kv_a_proj_with_mqa")
            if q_name in cached_a and kv_name in cached_a:
                q_shape, kv_shape = cached_a.pop(q_name), cached_a.pop(kv_name)
                if q_shape[1:] != kv_shape[1:]:
                    errors.append(f"{q_name} and {kv_name} cannot be concatenated on dim 0")
                land(q_name.replace("q_a_proj", "fused_qkv_a_proj_with_mqa"), (0, q_shape[0] + kv_shape[0]),
                     q_shape[1:], f"{q_name} + {kv_name}")
            continue
        if name not in params:
            errors.append(f"{name}: not found in params_dict (SGLang warns and skips it)")
            continue
        land(name, (0, shape[0]), shape[1:], name)
    errors += [f"{n}: its q_a_proj / kv_a_proj_with_mqa partner is missing, never loaded" for n in cached_a]
    for param, shape in params.items():
        end = 0
        for begin, stop in sorted(covered[param]):
            if begin != end:
                break
            end = stop
        if end != shape[0]:
            errors.append(f"{param} {shape}: rows {sorted(covered[param])} do not cover it")
    return errors


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    header, _ = tensors(path)
    assert {i["dtype"] for i in header.values()} == {"BF16"}
    return {name: tuple(info["shape"]) for name, info in header.items()}


@pytest.mark.parametrize("fusion", [False, True], ids=["separate-wk", "fused-wk-weights-proj"])
def test_every_tensor_lands_on_a_sglang_parameter(builds: Callable[[str], Path], fusion: bool) -> None:
    # The config does not set indexer_rope_interleave, so SGLang builds wk and weights_proj separately;
    # the fused layout (indexer_rope_interleave true, as GLM-5 may set it) must load the same names.
    out = builds("healthy")
    cfg = json.loads((out / "config.json").read_text())
    assert not cfg.get("indexer_rope_interleave", False)
    assert replay_loader(checkpoint_shapes(out), expected_params(cfg, fusion), cfg["num_hidden_layers"]) == []


def test_scrambled_still_loads(builds: Callable[[str], Path]) -> None:
    out = builds("scrambled")
    cfg = json.loads((out / "config.json").read_text())
    assert replay_loader(checkpoint_shapes(out), expected_params(cfg, False), cfg["num_hidden_layers"]) == []


def test_the_replay_catches_a_missing_or_misshapen_tensor(builds: Callable[[str], Path]) -> None:
    out = builds("healthy")
    cfg = json.loads((out / "config.json").read_text())
    shapes = checkpoint_shapes(out)
    params = expected_params(cfg, False)
    missing = {k: v for k, v in shapes.items() if k != "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"}
    errors = replay_loader(missing, params, 4)
    assert any("partner is missing" in e for e in errors)
    assert any("model.layers.2.self_attn.fused_qkv_a_proj_with_mqa.weight" in e and "do not cover" in e
               for e in errors)
    wrong = dict(shapes, **{"model.layers.1.mlp.up_proj.weight": (2048, 512)})
    assert any("up_proj" in e and "do not fit" in e for e in replay_loader(wrong, params, 4))
    extra = dict(shapes, **{"model.layers.0.self_attn.indexer.bogus.weight": (4, 4)})
    assert any("not found in params_dict" in e for e in replay_loader(extra, params, 4))


def test_glm5_has_the_same_tensors_and_another_architecture() -> None:
    v32, glm5 = dsa.make_config(4, 1, 2), dsa.make_config(4, 1, 2, arch="glm5")
    assert glm5["architectures"] == ["GlmMoeDsaForCausalLM"]
    assert {k: v for k, v in glm5.items() if k != "architectures"} == \
        {k: v for k, v in v32.items() if k != "architectures"}
    assert dsa.tensor_specs(glm5) == dsa.tensor_specs(v32)


# --------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------

def test_cli_prints_the_build(builds: Callable[[str], Path], tokenizer_dir: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = builds("healthy")
    assert llmserve_main(["checkpoint", "dsa-tiny", str(out), "--tokenizer", str(tokenizer_dir)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == str(out)
    assert "71 tensors, 154.0M params" in printed and H200_SERVED_SHA256 in printed


def test_module_runs_as_a_script_with_the_package_on_pythonpath(builds: Callable[[str], Path],
                                                                tokenizer_dir: Path, tmp_path: Path) -> None:
    # How the GPU machine runs it: `python -m ...` from elsewhere, the package found through PYTHONPATH.
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    proc = subprocess.run([sys.executable, "-m", "pytest_llmserve.testing.dsa_checkpoint", str(builds("healthy")),
                           "--tokenizer", str(tokenizer_dir)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert H200_SERVED_SHA256 in proc.stdout
    light = subprocess.run([sys.executable, "-c", "import sys, pytest_llmserve.testing.dsa_checkpoint; "
                            "print(sorted(m for m in ('filelock', 'httpx', 'pytest') if m in sys.modules))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert light.stdout.strip() == "[]", light.stderr


@pytest.mark.parametrize(("args", "named"), [
    (["--variant", "nan-early"], "variant 'nan-early'"),
    (["--layers", "0"], "layers = 0"),
    (["--layers", "four"], "--layers = 'four'"),
    (["--seed", "-1"], "seed = -1"),
    (["--arch", "glm4"], "arch 'glm4'"),
    (["--variant", "scrambled", "--layers", "1"], "layers = 1"),
])
def test_cli_bad_values_are_one_line_exit_2(args: list[str], named: str, tmp_path: Path, tokenizer_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = llmserve_main(["checkpoint", "dsa-tiny", str(tmp_path / "out"), "--tokenizer", str(tokenizer_dir), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("llmserve checkpoint: ") and named in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_cli_refuses_an_unmarked_directory(tmp_path: Path, tokenizer_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "weights.bin").write_bytes(b"precious")
    assert llmserve_main(["checkpoint", "dsa-tiny", str(tmp_path), "--tokenizer", str(tokenizer_dir)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "refusing to overwrite" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "weights.bin").read_bytes() == b"precious"

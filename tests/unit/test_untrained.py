"""``random_weights`` (declared per server, or recognised from the tiny-checkpoint builder's marker file when the
weights' sha256 is the one it records) and the one answer to "is this server's model untrained?"
(:func:`pytest_llmserve.config.untrained`, its reason alone by :func:`~pytest_llmserve.config.untrained_reason`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_llmserve import weights
from pytest_llmserve.config import (
    CACHE_ENV,
    CHECKPOINT_MARKER,
    ServerSpec,
    Untrained,
    config_from_table,
    untrained,
    untrained_reason,
)
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.testing import dsa_checkpoint as dsa
from pytest_llmserve.testing.checkpoints import write_safetensors

SOURCE = "/proj/llmserve.toml"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The digests this module's checks record go to a cache of its own, never the user's."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _spec(table: dict[str, object], source: str = SOURCE) -> ServerSpec:
    return config_from_table({"servers": {"tiny": {"engine": "sglang", "model": "/m", **table}}}, source).servers[0]


def _weights(folder: Path, fill: int = 1) -> str:
    """A tiny model.safetensors in ``folder``; its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / weights.WEIGHTS_FILE
    write_safetensors(path, {"w": ("BF16", [32], bytes([fill]) * 64)})
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: In a marker given to :func:`_model`: the sha256 of the weights written beside it.
WEIGHTS_SHA = "<the weights' sha256>"


def _model(tmp_path: Path, marker: object, *, fill: int = 1, name: str = "tiny-dsa") -> Path:
    """A model folder holding tiny weights and ``marker`` (text, or a JSON object where :data:`WEIGHTS_SHA`
    stands for the weights' sha256)."""
    folder = tmp_path / name
    digest = _weights(folder, fill)
    if isinstance(marker, dict):
        marker = json.dumps({k: digest if v == WEIGHTS_SHA else v for k, v in marker.items()})
    (folder / CHECKPOINT_MARKER).write_text(str(marker))
    return folder


def test_declared_random_weights_names_the_file() -> None:
    assert _spec({}).random_weights is None and untrained_reason(_spec({})) is None
    assert untrained(_spec({"random_weights": False})) is None
    found = untrained(_spec({"random_weights": True}))
    assert found == Untrained("random_weights = true declared in /proj/llmserve.toml for server 'tiny'", declared=True)
    assert untrained_reason(_spec({"random_weights": True})) == found.reason


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_a_bad_value_is_refused_naming_file_key_and_value(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        _spec({"random_weights": value})
    assert str(err.value) == (f"/proj/llmserve.toml: [tool.llmserve.servers.tiny] random_weights = {value!r}: "
                              "must be true or false")


def test_a_marker_whose_hash_is_the_weights_is_honoured(tmp_path: Path) -> None:
    folder = _model(tmp_path, {"random_weights": True, weights.SHA_KEY: WEIGHTS_SHA,
                               "architecture": "DeepseekV32ForCausalLM"})
    digest = hashlib.sha256((folder / weights.WEIGHTS_FILE).read_bytes()).hexdigest()
    found = untrained(_spec({"model": str(folder)}))
    assert found == Untrained(f"marker file {folder / CHECKPOINT_MARKER} says random_weights = true "
                              f"(weights sha256 {digest[:12]}… verified)", declared=False)
    assert untrained_reason(_spec({"model": str(folder)})) == found.reason
    # Relative to the configuration file's folder, as a user writes it beside the project.
    relative = _spec({"model": "tiny-dsa"}, source=str(tmp_path / "llmserve.toml"))
    assert untrained(relative) == found


def test_a_marker_copied_beside_other_weights_is_an_error_naming_both_hashes(tmp_path: Path) -> None:
    """The fault this check exists for: the tiny model's marker beside a trained model's weights would
    silence every trained-model oracle."""
    tiny = _model(tmp_path, {"random_weights": True, weights.SHA_KEY: WEIGHTS_SHA}, fill=1, name="tiny")
    tiny_sha = json.loads((tiny / CHECKPOINT_MARKER).read_text())[weights.SHA_KEY]
    trained = tmp_path / "trained"
    trained_sha = _weights(trained, fill=7)
    shutil.copyfile(tiny / CHECKPOINT_MARKER, trained / CHECKPOINT_MARKER)
    with pytest.raises(ConfigError) as err:
        untrained(_spec({"model": str(trained)}))
    message = str(err.value)
    assert message.startswith(f"{trained / CHECKPOINT_MARKER}: this checkpoint marker says random_weights = true "
                              f"for weights of sha256 {tiny_sha}, but {trained / weights.WEIGHTS_FILE} has sha256 "
                              f"{trained_sha}: "), message
    assert message.endswith("rebuild the checkpoint, remove the marker, or declare random_weights = true/false for "
                            "server 'tiny' in /proj/llmserve.toml"), message


def test_weights_rewritten_after_the_marker_are_caught_though_the_digest_was_cached(tmp_path: Path) -> None:
    folder = _model(tmp_path, {"random_weights": True, weights.SHA_KEY: WEIGHTS_SHA})
    spec = _spec({"model": str(folder)})
    assert untrained(spec) is not None  # verified, and the digest cached
    _weights(folder, fill=9)  # same size, other bytes, a new mtime
    with pytest.raises(ConfigError, match="has sha256 "):
        untrained(spec)


@pytest.mark.parametrize(("hash_value", "said"), [
    (None, 'records no "model_safetensors_sha256" (the sha256 of the model.safetensors it was written for)'),
    (12345, '"model_safetensors_sha256" = 12345: must be the sha256 of model.safetensors as hex'),
    ("", "\"model_safetensors_sha256\" = '': must be the sha256"),
])
def test_a_marker_without_a_usable_hash_is_no_evidence(tmp_path: Path, hash_value: object, said: str) -> None:
    marker: dict[str, object] = {"random_weights": True}
    if hash_value is not None:
        marker[weights.SHA_KEY] = hash_value
    folder = _model(tmp_path, marker)
    with pytest.raises(ConfigError) as err:
        untrained(_spec({"model": str(folder)}))
    assert str(err.value).startswith(f"{folder / CHECKPOINT_MARKER}: ") and said in str(err.value)


@pytest.mark.parametrize(("files", "held"), [
    ((), "its folder holds no *.safetensors file, and that hash covers model.safetensors alone"),
    (("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
     "its folder holds model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, and that hash covers"),
    (("model.safetensors", "extra.safetensors"),
     "its folder holds extra.safetensors, model.safetensors, and that hash covers model.safetensors alone"),
])
def test_a_marker_beside_weights_its_hash_does_not_cover_is_an_error(tmp_path: Path, files: tuple[str, ...],
                                                                     held: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in files:
        write_safetensors(folder / name, {"w": ("BF16", [1], b"\x00\x01")})
    (folder / CHECKPOINT_MARKER).write_text(json.dumps({"random_weights": True, weights.SHA_KEY: "ab" * 32}))
    with pytest.raises(ConfigError) as err:
        untrained(_spec({"model": str(folder)}))
    assert str(err.value).startswith(f"{folder / CHECKPOINT_MARKER}: ") and held in str(err.value), str(err.value)


def test_a_declaration_overrides_a_marker_and_nothing_is_hashed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _model(tmp_path, {"random_weights": True, weights.SHA_KEY: "ab" * 32})  # a lying marker

    def refuse(path: Path) -> str:
        raise AssertionError(f"hashed {path}")

    monkeypatch.setattr(weights, "file_sha256", refuse)
    assert untrained(_spec({"model": str(folder), "random_weights": False})) is None
    found = untrained(_spec({"model": str(folder), "random_weights": True}))
    assert found is not None and found.declared and found.reason.startswith("random_weights = true declared in ")


def test_a_trained_models_marker_or_none_at_all_is_trained(tmp_path: Path) -> None:
    # A marker that says the weights are trained needs no hash: it hides no oracle.
    assert untrained(_spec({"model": str(_model(tmp_path, {"random_weights": False}))})) is None
    assert untrained(_spec({"model": "HuggingFaceTB/SmolLM2-135M-Instruct"})) is None
    attached = config_from_table({"servers": {"r": {"engine": "vllm", "url": "http://node:8000"}}}, "x").servers[0]
    assert untrained(attached) is None


@pytest.mark.parametrize(("marker", "said"), [("{not json", "is not readable JSON"),
                                              ({"random_weights": "true"}, "\"random_weights\" = 'true'")])
def test_a_broken_marker_is_an_error_naming_the_file(tmp_path: Path, marker: object, said: str) -> None:
    folder = _model(tmp_path, marker)
    with pytest.raises(ConfigError) as err:
        untrained_reason(_spec({"model": str(folder)}))
    assert str(err.value).startswith(str(folder / CHECKPOINT_MARKER)) and said in str(err.value)


def test_the_marker_is_verified_once_per_weights_version(tmp_path: Path, private_cache: Path,
                                                         hashings: list[Path]) -> None:
    folder = _model(tmp_path, {"random_weights": True, weights.SHA_KEY: WEIGHTS_SHA})
    spec = _spec({"model": str(folder)})
    assert untrained(spec) == untrained(spec) == untrained(spec)
    assert hashings == [(folder / weights.WEIGHTS_FILE).resolve()]
    assert (private_cache / weights.DIGEST_CACHE_FILE).is_file()


# --------------------------------------------------------------------------- the builder's own marker

@pytest.fixture(scope="module")
def dsa_tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The DSA builder's checkpoint at one layer (228 MB, a few seconds), with a stand-in tokenizer as
    tests/unit/testing/test_dsa_checkpoint.py makes it; removed at the end."""
    root = tmp_path_factory.mktemp("dsa-marker")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, dsa.NAN_TOKEN: 3003}
    (tokenizer / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
    (tokenizer / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    yield dsa.build_dsa_checkpoint(root / "dsa-tiny", layers=1, tokenizer_dir=tokenizer)
    shutil.rmtree(root, ignore_errors=True)


def test_the_dsa_builders_marker_is_honoured(dsa_tiny: Path) -> None:
    digest = json.loads((dsa_tiny / CHECKPOINT_MARKER).read_text())[weights.SHA_KEY]
    found = untrained(_spec({"model": str(dsa_tiny)}))
    assert found == Untrained(f"marker file {dsa_tiny / CHECKPOINT_MARKER} says random_weights = true "
                              f"(weights sha256 {digest[:12]}… verified)", declared=False)


def test_the_dsa_builders_marker_beside_a_trained_model_is_refused(dsa_tiny: Path, tmp_path: Path) -> None:
    trained = tmp_path / "trained"
    _weights(trained, fill=3)
    shutil.copyfile(dsa_tiny / CHECKPOINT_MARKER, trained / CHECKPOINT_MARKER)
    with pytest.raises(ConfigError, match="the marker describes other weights"):
        untrained(_spec({"model": str(trained)}))


def test_random_weights_stays_out_of_a_baselines_server_args() -> None:
    from pytest_llmserve.gates.context import server_args

    assert "random_weights" not in server_args(_spec({"random_weights": True}))

"""Build a tiny random-weight DeepSeek Sparse Attention (DSA) checkpoint that SGLang 0.5.15 serves.

The correctness oracles need a DSA model that fits one GPU and whose weights are the same everywhere, so
that the NSA/DSA backend matrix (``--dsa-prefill-backend`` / ``--dsa-decode-backend``) can be exercised and
its backends compared on shared weights. This module writes one: DeepSeek-V3.2's architecture
(``DeepseekV32ForCausalLM``), shrunk, with seeded random weights, SmolLM2-135M-Instruct's tokenizer, and
a marker file ``llmserve-checkpoint.json`` that says the weights are random (``"random_weights": true``:
the suite reads it to report the oracles that need a trained model as not applicable).

Run it as::

    llmserve checkpoint dsa-tiny OUT [--variant V] [--seed N] [--layers N] [--tokenizer DIR] [--arch A]
    python -m pytest_llmserve.testing.dsa_checkpoint OUT [same options]   # numpy + the standard library only

or from code with :func:`build_dsa_checkpoint`.

Byte-identical on any machine
    The weights come from numpy's PCG64 *bit generator* (its raw uint64 stream is a stable API), turned
    into numbers with exact integer arithmetic (an Irwin-Hall sum of the four 16-bit parts of each raw
    word, scaled to std 0.02 by one IEEE multiply) and rounded to bfloat16 by hand (round to nearest
    even). No transcendental function is used, so no libm or SIMD difference can change a bit. The
    default build (seed 20250602, 4 layers, 32 index heads, std 0.02) has ``model.safetensors`` sha256
    ``73124cd2826f3c5ad4f65cd463b49bdc2c758512c8b5b65363055e42ed3bd908``, the checkpoint that SGLang
    0.5.15 served on an H200 on 2026-12-02 with the flashmla_sparse, flashmla_kv and tilelang decode
    backends (the probe's ``mk_dsa_model.py``; this module is its port and writes the same bytes).

The kernels' hard limits (SGLang 0.5.15 on SM90), and the value chosen for each
    * ``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 64: fixed by FlashMLA (sparse and kv).
    * ``index_topk`` 2048: FlashMLA's kv decode and TileLang assert it.
    * ``index_head_dim`` 128: ``DSATokenToKVPool`` asserts it.
    * ``index_n_heads`` 32 or 64: DeepGEMM's SM90 paged MQA logits kernel (the indexer) takes only these; 32.
    * ``num_attention_heads`` must divide 64 (FlashMLA on SM90 pads the query heads to 64; TileLang pads
      to 16): 16, real V3.2's 128 heads at tensor parallel 8.
    * ``page_size`` 64: a server flag (``--page-size 64``), not a checkpoint field, but the DSA backends
      need it.
    * ``hidden_size`` a multiple of 256 and ``q_lora_rank + kv_lora_rank + qk_rope_head_dim`` a multiple of
      16: then decode takes the JIT ``dsv3_fused_a_gemm`` path the real model takes (1024; 256 + 512 + 64 =
      832). Other sizes fall back to cuBLAS and would not exercise it.
    * ``vocab_size`` a multiple of 64 (``VocabParallelEmbedding`` pads to 64; a padded embedding would
      differ from the checkpoint's shape): 49152, SmolLM2's tokenizer.
    * ``first_k_dense_replace`` = ``num_hidden_layers``: every layer has a dense MLP, so no MoE layer (and
      no MoE kernel) is built; the MoE fields must still exist, the loader builds its expert map from them.
    * Plain RoPE (``rope_theta`` only): no YaRN, no mscale.
    * Weights in bfloat16.

Variants (each deterministic; all share the healthy build's random stream, so a variant differs from
the healthy checkpoint of the same seed only in the tensors named here)
``healthy``
    The default; sha256 above.
``nan-late``
    Row 3003 of ``model.embed_tokens.weight`` (the token ``" primary"``, ``Ġprimary`` in SmolLM2's
    tokenizer.json) is NaN (bfloat16 ``0x7FC0``) in every element. The token appears in the plugin's NaN
    probe "The three primary colors are" (``verdicts/oracles.py``: ``DEFAULT_NAN_PROMPTS[3]``, also a
    batch and differential prompt), a plain completion prompt, so no chat template decides whether it is
    sent. It is in none of the requests the server gets before the suite runs: SGLang's warm-up
    (``srt/entrypoints/http_server.py`` ``_execute_server_warmup``: the text "The capital city of France
    is", tokens 504 3575 2240 282 4649 314), ``/health_generate`` (``input_ids=[0]``), and the plugin's
    readiness request (``server/handle.py``: the prompt "Hello", token 19556). So the server boots and
    passes readiness, and the first prefill containing " primary" puts NaN into the residual stream at
    that position, from where attention carries it to every later position and the logits. Caveat: the
    warm-up and readiness requests also *generate* a few tokens, which on random weights are arbitrary; a
    generated 3003 would be looked up only if a further decode step followed (odds about 1 in 49152 per
    step).
``scrambled``
    The decoder layers in reverse order (tensor names ``model.layers.{i}.`` renamed to
    ``model.layers.{L-1-i}.``; the bytes and their order in the file are untouched), as
    ``testing/checkpoints.py`` does for SmolLM2. On random weights this is a different random model, not a
    broken one: it is for the plumbing (a derived checkpoint boots, is recognised as random), not for an
    oracle to catch.
``fp8-kv-outlier``
    A fault meant for one backend only: the FP8 KV cache of the ``flashmla_kv`` decode backend.
    *A construction whose effect is confirmed only on the GPU.* In every layer,
    ``self_attn.kv_a_layernorm.weight`` (the RMSNorm scale of the compressed latent ``c_kv``, 512
    channels) is 1e6 (bfloat16 ``0x4974``, 999424) at channels 0, 128, 256 and 384 (one per 128-channel
    group) and 1.0 elsewhere, and the columns of ``self_attn.kv_b_proj.weight`` (shape
    ``[heads * (nope + v), kv_lora]``, the up-projection of ``c_kv`` to keys and values) at those
    channels are zero. Reasoning:

    - In exact or bfloat16 arithmetic the outlier channels contribute nothing: MLA's attention scores are
      ``q_nope W_UK . c_kv`` (the absorbed query has exact zeros at those channels, and 0 x 1e6 = 0) and
      its values are ``(softmax . c_kv) W_UV`` (zero rows of ``W_UV``). So a bfloat16-KV backend
      (flashmla_sparse, tilelang) decodes as it would with those channels absent: the differences from a
      healthy-looking model are only rounding, and the backends agree with each other.
    - An FP8 (e4m3) KV cache quantised per 128-value tile with scale ``amax / 448`` maps each tile's
      outlier to 448 and the other 127 channels (|value| about 1, ratio to the tile max about 1e-6) to
      about 4.5e-4, below half of e4m3's smallest subnormal (2**-9, about 1.95e-3): they flush to zero.
      With a static scale instead, the outlier itself overflows e4m3 (max 448) to NaN. Either way that
      backend's attention loses its keys' latent part and all of its values (only the bfloat16 RoPE part
      of the keys survives): its output departs from the bfloat16 backends' (a differential failure) or
      is NaN.

GLM-5 (``--arch glm5``)
    SGLang 0.5.15 registers ``GlmMoeDsaForCausalLM`` (``srt/models/glm4_moe.py`` line 1480: ``class
    GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM)``, only ``determine_num_fused_shared_experts`` overridden;
    line 1485: ``EntryClass = [Glm4MoeForCausalLM, GlmMoeDsaForCausalLM]``) and treats it as DSA beside
    ``DeepseekV32ForCausalLM`` (``srt/configs/model_config.py`` line 112 ``is_deepseek_dsa``; the server
    argument overrides in ``srt/arg_groups/overrides.py`` and ``srt/server_args.py``). Its parameters are
    DeepseekV2's, so its weight names are exactly V3.2's: ``--arch glm5`` writes the same
    ``model.safetensors`` (same sha256 for the same seed) with ``architectures: ["GlmMoeDsaForCausalLM"]``.
    The config keeps ``model_type: "deepseek_v32"`` (SGLang's own alias of transformers'
    ``DeepseekV3Config``, ``srt/utils/hf_transformers/common.py`` line 127), the schema the H200 probe
    proved; real GLM-5 says ``glm_moe_dsa``, whose transformers config class (newer transformers only)
    derives other fields (``indexer_types``, ``head_dim``) that this tiny model does not need. Every layer
    is dense (``first_k_dense_replace`` = layers), so no MoE kernel is involved. Not yet served on a GPU.

The destination is built in a temporary sibling directory and renamed into place; it carries the marker,
so a second call with the same arguments does nothing, and a directory without the marker is never
overwritten. Only the standard library and numpy are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from pytest_llmserve.config import CHECKPOINT_MARKER
from pytest_llmserve.engines.embedded import model_dir
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.json_encoding import dumps

BUILDER = "dsa-tiny"
MARKER = CHECKPOINT_MARKER  # the file every oracle reads random_weights from (config.untrained_reason)
FORMAT_VERSION = 1  # bump when a build's recipe changes, so old directories are rebuilt
DEFAULT_SEED = 20250602
DEFAULT_LAYERS = 4
STD = 0.02
INDEX_N_HEADS = 32
VOCAB_SIZE = 49152
#: sha256 of model.safetensors of the default healthy build (the checkpoint SGLang 0.5.15 served on the H200).
REFERENCE_SHA256 = "73124cd2826f3c5ad4f65cd463b49bdc2c758512c8b5b65363055e42ed3bd908"
GENERATOR = "numpy PCG64 random_raw -> Irwin-Hall(4x16bit) -> bf16 RNE"

VARIANTS = ("healthy", "nan-late", "scrambled", "fp8-kv-outlier")
ARCHITECTURES = {"deepseek-v32": "DeepseekV32ForCausalLM", "glm5": "GlmMoeDsaForCausalLM"}
DEFAULT_ARCH = "deepseek-v32"

#: nan-late: the token whose embedding row is NaN (see the module docstring for why this one).
NAN_TOKEN = "Ġprimary"  # " primary" in the byte-level BPE vocabulary
NAN_TOKEN_ID = 3003
#: fp8-kv-outlier: the outlier scale and the channel of each 128-channel group of the 512-wide latent.
OUTLIER_SCALE = 1e6
OUTLIER_TILE = 128

BF16_ONE = 0x3F80
BF16_NAN = 0x7FC0

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)
#: Where the SmolLM2 tokenizer is on the lent GPU machine (the engines' staging area).
GPU_MACHINE_TOKENIZER_DIR = Path("/root/llmserve-engines/models/SmolLM2-135M-Instruct")
_CHUNK = 1 << 22  # raw words per generation step (32 MiB of uint64): bounds memory, not the result


class DsaCheckpointError(LLMServeError):
    """A bad argument, a missing tokenizer, or a destination that cannot be written."""


# --------------------------------------------------------------------------------------------------
# config and tensor layout
# --------------------------------------------------------------------------------------------------

class DsaConfig(TypedDict):
    """The tiny checkpoint's config.json (:func:`make_config`): DeepSeek-V3.2's keys, shrunk sizes."""

    architectures: list[str]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    num_attention_heads: int
    num_key_value_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    index_topk: int
    index_head_dim: int
    index_n_heads: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    attention_dropout: float
    tie_word_embeddings: bool
    num_nextn_predict_layers: int
    initializer_range: float
    bos_token_id: int
    eos_token_id: int
    use_cache: bool
    torch_dtype: str


def make_config(layers: int, bos: int, eos: int, *, arch: str = DEFAULT_ARCH,
                index_n_heads: int = INDEX_N_HEADS) -> DsaConfig:
    """DeepSeek-V3.2's layout, shrunk. The module docstring gives the constraint behind each size."""
    return {
        "architectures": [ARCHITECTURES[arch]],  # DSA = this architecture + index_topk set
        "model_type": "deepseek_v32",  # SGLang maps it to its DeepseekV3Config alias
        "vocab_size": VOCAB_SIZE,  # SmolLM2's tokenizer; a multiple of 64
        "hidden_size": 1024,  # multiple of 256: the JIT dsv3_fused_a_gemm path
        "intermediate_size": 2048,  # dense MLP only
        "num_hidden_layers": layers,
        "first_k_dense_replace": layers,  # every layer dense: no MoE built at all
        "moe_layer_freq": 1,
        # The loader builds its expert name map from n_routed_experts, so the MoE fields must exist,
        # but no MoE layer is instantiated.
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "num_attention_heads": 16,  # divides 64 (FlashMLA SM90 head padding)
        "num_key_value_heads": 16,
        "q_lora_rank": 256,  # q_lora + kv_lora + rope = 832, a multiple of 16
        "kv_lora_rank": 512,  # FlashMLA: fixed
        "qk_rope_head_dim": 64,  # FlashMLA: fixed
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "index_topk": 2048,  # FlashMLA kv decode and TileLang assert it
        "index_head_dim": 128,  # DSATokenToKVPool asserts it
        "index_n_heads": index_n_heads,  # DeepGEMM SM90 paged MQA logits: 32 or 64
        # Room for the long-context probes past index_topk (verdicts/long_context.py: up to 4 x 2048 = 8,192
        # tokens of context and the decode after it); plain RoPE has no trained length to respect. Not in the
        # weights: model.safetensors and its sha256 are the same as with the 4,096 of 2026-12-02.
        "max_position_embeddings": 16384,
        # Plain RoPE: transformers 5.x turns this into rope_parameters {"rope_type": "default"} and
        # deepseek_v2.py passes rope_scaling=None (no YaRN, no mscale); rope_interleave defaults to True.
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,  # no MTP layer
        "initializer_range": STD,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def tensor_specs(cfg: DsaConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, kind)`` in HF DeepSeek-V3.2 naming, sorted by name (generation and file order).

    kind: ``w`` random, ``one`` all 1.0, ``zero`` all 0.0.
    """
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    heads, q_lora, kv_lora = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    rope, nope, v_dim = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    index_heads, index_dim = cfg["index_n_heads"], cfg["index_head_dim"]
    inter = cfg["intermediate_size"]
    specs: list[tuple[str, tuple[int, ...], str]] = [
        ("model.embed_tokens.weight", (vocab, hidden), "w"),
        ("model.norm.weight", (hidden,), "one"),
        ("lm_head.weight", (vocab, hidden), "w"),
    ]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        specs += [
            (p + "input_layernorm.weight", (hidden,), "one"),
            (p + "post_attention_layernorm.weight", (hidden,), "one"),
            (a + "q_a_proj.weight", (q_lora, hidden), "w"),
            (a + "q_a_layernorm.weight", (q_lora,), "one"),
            (a + "q_b_proj.weight", (heads * (nope + rope), q_lora), "w"),
            (a + "kv_a_proj_with_mqa.weight", (kv_lora + rope, hidden), "w"),
            (a + "kv_a_layernorm.weight", (kv_lora,), "one"),
            (a + "kv_b_proj.weight", (heads * (nope + v_dim), kv_lora), "w"),
            (a + "o_proj.weight", (hidden, heads * v_dim), "w"),
            # The DSA lightning indexer (srt/layers/attention/dsa/dsa_indexer.py, Indexer.__init__).
            (a + "indexer.wq_b.weight", (index_heads * index_dim, q_lora), "w"),
            (a + "indexer.wk.weight", (index_dim, hidden), "w"),
            (a + "indexer.weights_proj.weight", (index_heads, hidden), "w"),
            (a + "indexer.k_norm.weight", (index_dim,), "one"),
            (a + "indexer.k_norm.bias", (index_dim,), "zero"),
            (p + "mlp.gate_proj.weight", (inter, hidden), "w"),
            (p + "mlp.up_proj.weight", (inter, hidden), "w"),
            (p + "mlp.down_proj.weight", (hidden, inter), "w"),
        ]
    return sorted(specs)


def outlier_channels(kv_lora_rank: int) -> tuple[int, ...]:
    """fp8-kv-outlier: the first channel of each 128-channel group of the latent (0, 128, 256, 384)."""
    return tuple(range(0, kv_lora_rank, OUTLIER_TILE))


def scrambled_name(name: str, layers: int) -> str:
    """The tensor's name with the decoder layer order reversed (other names unchanged)."""
    prefix = "model.layers."
    if not name.startswith(prefix):
        return name
    index, rest = name[len(prefix):].split(".", 1)
    return f"{prefix}{layers - 1 - int(index)}.{rest}"


# --------------------------------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------------------------------

# Irwin-Hall(4) of 16-bit uniforms: sum in [0, 4 * 65535], mean 2 * 65535, variance 4 * (65536**2 - 1) / 12.
_IH_MEAN = 2 * 65535
_IH_STD = float(np.sqrt(4.0 * (65536.0**2 - 1.0) / 12.0))


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (finite inputs)."""
    # In uint32: the largest finite pattern, 0xFF7FFFFF, plus 0x8000 does not wrap (only NaNs would).
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def random_bf16(bitgen: np.random.PCG64, n: int, std: float = STD) -> np.ndarray:
    """``n`` bfloat16 bit patterns, mean 0, the given std; the same bits on every machine."""
    out = np.empty(n, dtype=np.uint16)
    scale = np.float64(std / _IH_STD)
    for start in range(0, n, _CHUNK):
        count = min(_CHUNK, n - start)
        raw = np.ascontiguousarray(bitgen.random_raw(count), dtype="<u8")
        # The four 16-bit parts of each word, summed exactly ((w & 0xFFFF) + (w >> 16 & 0xFFFF) + ...):
        # column by column in int32, which holds 4 * 65535 and is faster than shifting uint64s.
        parts = raw.view("<u2").reshape(count, 4)
        total = parts[:, 0].astype(np.int32)
        for column in (1, 2, 3):
            total += parts[:, column]
        x = ((total - _IH_MEAN).astype(np.float64) * scale).astype(np.float32)
        out[start:start + count] = f32_to_bf16_bits(x)
    return out


def bf16_bits(value: float) -> int:
    return int(f32_to_bf16_bits(np.array([value], dtype=np.float32))[0])


# --------------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------------

def encode_header(entries: Sequence[tuple[str, tuple[int, ...]]]) -> bytes:
    """8-byte length + JSON header of BF16 tensors stored back to back in ``entries`` order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in entries:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the offset where its data begins."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)), 8 + size


# --------------------------------------------------------------------------------------------------
# the tokenizer
# --------------------------------------------------------------------------------------------------

def default_tokenizer_dirs() -> list[Path]:
    """The embedded default's SmolLM2 directory (``llmserve setup``), then the GPU machine's copy."""
    return [model_dir(), GPU_MACHINE_TOKENIZER_DIR]


def find_tokenizer_dir(explicit: str | os.PathLike[str] | None) -> Path:
    tried = [Path(explicit).expanduser()] if explicit is not None else default_tokenizer_dirs()
    for candidate in tried:
        if (candidate / "tokenizer.json").is_file():
            return candidate
    source = "--tokenizer" if explicit is not None else "the default places"
    raise DsaCheckpointError(
        f"no SmolLM2 tokenizer (tokenizer.json) in {', '.join(str(p) for p in tried)} ({source}); "
        "run `llmserve setup` to make the embedded SmolLM2, or pass --tokenizer DIR")


def _tokenizer_facts(tok_dir: Path, variant: str) -> tuple[int, int]:
    """bos/eos ids (the tokenizer directory's config.json, SmolLM2's 1 and 2 by default), after checking
    that the vocabulary fits the embedding and, for nan-late, that the NaN token has its documented id."""
    bos, eos = 1, 2  # SmolLM2: <|im_start|>, <|im_end|>
    config = tok_dir / "config.json"
    try:
        if config.is_file():
            data = json.loads(config.read_text())
            bos, eos = int(data.get("bos_token_id", bos)), int(data.get("eos_token_id", eos))
        tokenizer = json.loads((tok_dir / "tokenizer.json").read_text())
        vocab = tokenizer.get("model", {}).get("vocab", {})
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise DsaCheckpointError(f"{tok_dir}: unreadable tokenizer files ({exc})") from None
    ids = [int(i) for i in vocab.values()] if isinstance(vocab, dict) else []
    if not ids or max(ids) >= VOCAB_SIZE:
        raise DsaCheckpointError(f"{tok_dir}/tokenizer.json: {len(ids)} vocabulary entries, largest id "
                                 f"{max(ids, default=-1)}; SmolLM2's tokenizer (ids below {VOCAB_SIZE}) is needed")
    if variant == "nan-late" and vocab.get(NAN_TOKEN) != NAN_TOKEN_ID:
        raise DsaCheckpointError(f"{tok_dir}/tokenizer.json: token {NAN_TOKEN!r} has id {vocab.get(NAN_TOKEN)}, "
                                 f"not {NAN_TOKEN_ID}: not SmolLM2's tokenizer, and nan-late's row is chosen for it")
    return bos, eos


# --------------------------------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildInfo:
    """What a build wrote (read back from the marker)."""

    out: Path
    num_tensors: int
    num_params: int
    sha256: str
    marker: dict[str, Any]


def _validate(variant: str, seed: int, layers: int, arch: str) -> None:
    if variant not in VARIANTS:
        raise DsaCheckpointError(f"variant {variant!r}: must be one of {', '.join(VARIANTS)}")
    if arch not in ARCHITECTURES:
        raise DsaCheckpointError(f"arch {arch!r}: must be one of {', '.join(ARCHITECTURES)}")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise DsaCheckpointError(f"layers = {layers!r}: must be an integer of at least 1")
    if variant == "scrambled" and layers < 2:
        raise DsaCheckpointError(f"layers = {layers}: the scrambled variant reverses the layer order, "
                                 "so it needs at least 2")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DsaCheckpointError(f"seed = {seed!r}: must be a non-negative integer")


def _identity(variant: str, seed: int, layers: int, arch: str) -> dict[str, object]:
    """The marker keys that decide whether an existing build is this one."""
    return {"builder": BUILDER, "architecture": ARCHITECTURES[arch], "variant": variant, "seed": seed,
            "layers": layers, "format_version": FORMAT_VERSION}


def _variant_edit(variant: str, cfg: DsaConfig) -> tuple[Callable[[str, np.ndarray], None], dict[str, object]]:
    """An in-place edit applied to each tensor (flat uint16 bf16 bits) before it is written, and what it
    records in the marker."""
    kv_lora = cfg["kv_lora_rank"]
    channels = outlier_channels(kv_lora)
    outlier = bf16_bits(OUTLIER_SCALE)

    def edit(name: str, bits: np.ndarray) -> None:
        if variant == "nan-late" and name == "model.embed_tokens.weight":
            hidden = cfg["hidden_size"]
            bits[NAN_TOKEN_ID * hidden:(NAN_TOKEN_ID + 1) * hidden] = BF16_NAN
        elif variant == "fp8-kv-outlier" and name.endswith(".self_attn.kv_a_layernorm.weight"):
            bits[list(channels)] = outlier
        elif variant == "fp8-kv-outlier" and name.endswith(".self_attn.kv_b_proj.weight"):
            bits.reshape(-1, kv_lora)[:, list(channels)] = 0

    details: dict[str, object] = {}
    if variant == "nan-late":
        details = {"nan_tensor": "model.embed_tokens.weight", "nan_token_id": NAN_TOKEN_ID,
                   "nan_token": NAN_TOKEN.replace("Ġ", " ")}
    elif variant == "fp8-kv-outlier":
        details = {"outlier_channels": list(channels), "outlier_value_bf16": f"0x{outlier:04X}",
                   "outlier_tensors": ["self_attn.kv_a_layernorm.weight (outlier channels = 1e6)",
                                       "self_attn.kv_b_proj.weight (outlier columns = 0)"]}
    elif variant == "scrambled":
        layers = cfg["num_hidden_layers"]
        details = {"layer_order": [layers - 1 - i for i in range(layers)]}
    return edit, details


def _write_model(path: Path, cfg: DsaConfig, variant: str, seed: int,
                 edit: Callable[[str, np.ndarray], None]) -> tuple[int, int, str]:
    """Generate and write model.safetensors tensor by tensor; (tensors, params, sha256)."""
    specs = tensor_specs(cfg)
    layers = cfg["num_hidden_layers"]
    # The data keeps the healthy order; scrambled renames entries only, so offsets stay the healthy ones.
    names = [scrambled_name(n, layers) if variant == "scrambled" else n for n, _, _ in specs]
    header = encode_header([(name, shape) for name, (_, shape, _) in zip(names, specs, strict=True)])
    digest = hashlib.sha256(header)
    bitgen = np.random.PCG64(seed)
    params = 0
    with open(path, "wb") as f:
        f.write(header)
        for name, shape, kind in specs:
            count = int(np.prod(shape))
            params += count
            if kind == "w":
                bits = random_bf16(bitgen, count)
            elif kind == "one":
                bits = np.full(count, BF16_ONE, dtype=np.uint16)
            else:
                bits = np.zeros(count, dtype=np.uint16)
            edit(name, bits)
            data = bits.astype("<u2", copy=False).tobytes()
            digest.update(data)
            f.write(data)
    return len(specs), params, digest.hexdigest()


@contextlib.contextmanager
def _locked(dst: Path) -> Iterator[None]:
    """One build of ``dst`` at a time (parallel sessions sharing a directory): the second finds it made."""
    with open(dst.parent / f".{dst.name}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def read_marker(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of a directory this builder made, or None (absent or unreadable)."""
    try:
        data = json.loads((Path(out) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_dsa_checkpoint(out: str | os.PathLike[str], *, variant: str = "healthy", seed: int = DEFAULT_SEED,
                         layers: int = DEFAULT_LAYERS, tokenizer_dir: str | os.PathLike[str] | None = None,
                         arch: str = DEFAULT_ARCH) -> Path:
    """Write the checkpoint into ``out`` (see the module docstring) and return its resolved path.

    Idempotent: returns at once when ``out`` holds this builder's marker with the same variant, seed,
    layers and architecture. A directory without the marker is never overwritten (an empty one is
    replaced); one with a marker of other arguments is rebuilt.
    """
    return build(out, variant=variant, seed=seed, layers=layers, tokenizer_dir=tokenizer_dir, arch=arch).out


def build(out: str | os.PathLike[str], *, variant: str = "healthy", seed: int = DEFAULT_SEED,
          layers: int = DEFAULT_LAYERS, tokenizer_dir: str | os.PathLike[str] | None = None,
          arch: str = DEFAULT_ARCH) -> BuildInfo:
    """:func:`build_dsa_checkpoint`, returning what was built (tensor and parameter counts, sha256)."""
    _validate(variant, seed, layers, arch)
    dst = Path(out).expanduser().resolve()
    if dst.exists() and not dst.is_dir():
        raise DsaCheckpointError(f"{dst}: exists and is not a directory")
    if dst.is_dir() and read_marker(dst) is None and any(dst.iterdir()):
        # Checked before the tokenizer, so the refusal is the first thing a user sees.
        raise DsaCheckpointError(f"{dst}: exists and was not made by this builder (no {MARKER}); "
                                 "refusing to overwrite it")
    want = _identity(variant, seed, layers, arch)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with _locked(dst):
            return _build_locked(dst, want, variant, seed, layers, arch, tokenizer_dir)
    except OSError as exc:
        raise DsaCheckpointError(f"{dst}: cannot write the checkpoint ({exc.strerror or exc})") from None


def _is_built(dst: Path, want: Mapping[str, object]) -> dict[str, Any] | None:
    have = read_marker(dst)
    if have is None or any(have.get(k) != v for k, v in want.items()):
        return None
    if not (dst / "model.safetensors").is_file() or not (dst / "config.json").is_file():
        return None
    return have


def _build_locked(dst: Path, want: Mapping[str, object], variant: str, seed: int, layers: int, arch: str,
                  tokenizer_dir: str | os.PathLike[str] | None) -> BuildInfo:
    have = _is_built(dst, want)
    if have is not None:
        return BuildInfo(dst, int(have.get("num_tensors", 0)), int(have.get("num_params", 0)),
                         str(have.get("model_safetensors_sha256", "")), have)
    if dst.exists():
        if read_marker(dst) is None:
            if any(dst.iterdir()):  # made by someone else since the first look
                raise DsaCheckpointError(f"{dst}: exists and was not made by this builder (no {MARKER}); "
                                         "refusing to overwrite it")
            dst.rmdir()
    tok_dir = find_tokenizer_dir(tokenizer_dir)
    bos, eos = _tokenizer_facts(tok_dir, variant)
    cfg = make_config(layers, bos, eos, arch=arch)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the engine may run as another user
        (tmp / "config.json").write_text(dumps(cfg, indent=2) + "\n")
        copied = []
        for name in TOKENIZER_FILES:
            if (tok_dir / name).is_file():
                shutil.copyfile(tok_dir / name, tmp / name)
                copied.append(name)
        edit, details = _variant_edit(variant, cfg)
        num_tensors, num_params, digest = _write_model(tmp / "model.safetensors", cfg, variant, seed, edit)
        marker = {**want, "random_weights": True, "model_safetensors_sha256": digest,
                  "num_tensors": num_tensors, "num_params": num_params, "std": STD,
                  "index_n_heads": cfg["index_n_heads"], "generator": GENERATOR,
                  "tokenizer_from": str(tok_dir), "tokenizer_files": copied, **details}
        (tmp / MARKER).write_text(dumps(marker, indent=2) + "\n")
        if dst.exists():  # a build of other arguments, ours by its marker: replaced
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildInfo(dst, num_tensors, num_params, digest, marker)


# --------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``llmserve checkpoint dsa-tiny`` and ``python -m ...dsa_checkpoint``.

    Values are checked by the builder, not by argparse, so a bad one is one line naming it."""
    parser.add_argument("out", help="directory to create (refused if it exists without this builder's marker)")
    parser.add_argument("--variant", default="healthy", help=f"one of {', '.join(VARIANTS)} (default healthy)")
    parser.add_argument("--seed", default=str(DEFAULT_SEED), help=f"random seed (default {DEFAULT_SEED})")
    parser.add_argument("--layers", default=str(DEFAULT_LAYERS), help=f"decoder layers (default {DEFAULT_LAYERS})")
    parser.add_argument("--tokenizer", default=None,
                        help="directory with SmolLM2's tokenizer.json (default: the embedded SmolLM2 of "
                             f"`llmserve setup`, then {GPU_MACHINE_TOKENIZER_DIR})")
    parser.add_argument("--arch", default=DEFAULT_ARCH,
                        help=f"{' or '.join(ARCHITECTURES)} (default {DEFAULT_ARCH}); glm5 writes "
                             "GlmMoeDsaForCausalLM with the same weights")


def _int_option(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise DsaCheckpointError(f"{option} = {text!r}: not an integer") from None


def run_from_args(args: argparse.Namespace) -> int:
    """Build from parsed arguments and print the result; raises :class:`DsaCheckpointError` on bad input."""
    info = build(args.out, variant=args.variant, seed=_int_option("--seed", args.seed),
                 layers=_int_option("--layers", args.layers), tokenizer_dir=args.tokenizer, arch=args.arch)
    print(info.out)
    print(f"  {info.marker.get('architecture')}, variant {info.marker.get('variant')}, seed "
          f"{info.marker.get('seed')}, {info.marker.get('layers')} layers: {info.num_tensors} tensors, "
          f"{info.num_params / 1e6:.1f}M params")
    print(f"  model.safetensors sha256 {info.sha256}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_llmserve.testing.dsa_checkpoint",
                                     description="Write a tiny random-weight DeepSeek-V3.2 (DSA) checkpoint.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except DsaCheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The embedded default's dtype follows the CPU: bfloat16 only where the CPU computes in it natively."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmserve.engines import embedded

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2\n"
AVX512_NO_BF16 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512bw avx512vl avx512_vnni\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(("cpuinfo", "dtype"), [
    (AVX2_ONLY, "float32"), (AVX512_NO_BF16, "float32"),
    (AVX512_BF16, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16"), (GRAVITON3, "bfloat16"),
])
def test_dtype_follows_the_cpus_native_bf16(tmp_path: Path, cpuinfo: str, dtype: str) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert embedded.default_dtype(path) == dtype


def test_unreadable_cpuinfo_means_float32(tmp_path: Path) -> None:
    # float32 is correct on every CPU; bfloat16 without native support is only slower.
    assert embedded.default_dtype(tmp_path / "absent") == "float32"


def test_default_spec_passes_the_dtype_to_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "default_dtype", lambda: "float32")
    args = embedded.default_spec().args
    assert args[args.index("--dtype") + 1] == "float32"

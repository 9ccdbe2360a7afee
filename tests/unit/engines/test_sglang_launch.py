"""SGLang adapter: flag detection, version-dependent flag mapping, facts from log + metrics + /server_info."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines.sglang.launch import (
    KNOWN_VERSIONS,
    FlagSet,
    SGLangAdapter,
    clear_flag_cache,
    detect_sglang_flags,
    flagset_for_version,
    flagset_from_help,
)
from pytest_llmserve.errors import ConfigError, ServerStartError

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def spec(**kwargs: object) -> ServerSpec:
    base: dict[str, object] = {
        "name": "glm",
        "engine": "sglang",
        "model": "/models/GLM-5",
        "source": "llmserve.toml",
        "python": "/venv/bin/python",
    }
    base.update(kwargs)
    return ServerSpec(**base)  # type: ignore[arg-type]


def plan_for(version: str, **kwargs: object) -> tuple[list[str], list[str]]:
    plan = SGLangAdapter(flagset_for_version(version)).launch_plan(spec(**kwargs), "127.0.0.1", 30000)
    return plan.argv, plan.notes


def flag_value(argv: list[str], flag: str) -> list[str]:
    """The values after ``flag`` up to the next flag."""
    at = argv.index(flag)
    values = []
    for arg in argv[at + 1 :]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_basic_plan_always_passes_an_explicit_seed(version: str) -> None:
    adapter = SGLangAdapter(flagset_for_version(version))
    assert adapter.name == "sglang"
    assert adapter.generation_counter == "sglang:generation_tokens_total"
    plan = adapter.launch_plan(spec(seed=0), "127.0.0.1", 30000)
    assert plan.argv[:9] == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/GLM-5",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
    ]
    assert flag_value(plan.argv, "--random-seed") == ["0"]  # SGLang would draw a random one otherwise
    assert "--enable-metrics" in plan.argv
    assert not any(a.startswith("--speculative") for a in plan.argv)  # None means: pass nothing
    assert plan.health_path == "/health_generate"
    assert plan.generation_probe is True
    assert plan.base_url == "http://127.0.0.1:30000"
    assert plan.model_name == "/models/GLM-5"
    assert any("speculative=None" in n for n in plan.notes)


def test_nsa_backends_per_version() -> None:
    options = {"nsa_prefill_backend": "flashmla_auto", "nsa_decode_backend": "flashmla_kv"}
    argv, _ = plan_for("0.5.9", **options)
    assert flag_value(argv, "--nsa-prefill-backend") == ["flashmla_auto"]
    assert flag_value(argv, "--nsa-decode-backend") == ["flashmla_kv"]
    for version in ("0.5.15", "0.5.23"):  # deprecated alias in 0.5.15, removed in 0.5.23: use --dsa-*
        argv, notes = plan_for(version, **options)
        assert flag_value(argv, "--dsa-prefill-backend") == ["flashmla_auto"]
        assert flag_value(argv, "--dsa-decode-backend") == ["flashmla_kv"]
        assert "--nsa-prefill-backend" not in argv
        assert any("nsa_decode_backend='flashmla_kv' -> --dsa-decode-backend flashmla_kv" in n for n in notes)


def test_cuda_graph_sizes_per_version() -> None:
    graph = CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8), max_batch_size=8)
    argv, _ = plan_for("0.5.9", cuda_graph=graph)
    assert flag_value(argv, "--cuda-graph-bs") == ["1", "2", "4", "8"]
    assert flag_value(argv, "--cuda-graph-max-bs") == ["8"]
    for version in ("0.5.15", "0.5.23"):
        argv, notes = plan_for(version, cuda_graph=graph)
        assert flag_value(argv, "--cuda-graph-bs-decode") == ["1", "2", "4", "8"]
        assert flag_value(argv, "--cuda-graph-max-bs-decode") == ["8"]
        assert "--cuda-graph-bs" not in argv
        assert "--cuda-graph-max-bs" not in argv
        assert any("--cuda-graph-bs-decode 1 2 4 8" in n and version in n for n in notes)


def test_cuda_graph_off_per_version() -> None:
    argv, _ = plan_for("0.5.9", cuda_graph=CudaGraphSpec(enabled=False))
    assert "--disable-cuda-graph" in argv
    for version in ("0.5.15", "0.5.23"):
        argv, notes = plan_for(version, cuda_graph=CudaGraphSpec(enabled=False))
        assert "--disable-cuda-graph" not in argv  # deprecated there
        assert flag_value(argv, "--cuda-graph-backend-decode") == ["disabled"]
        # --disable-cuda-graph used to switch off prefill graphs too; keep that meaning
        assert flag_value(argv, "--cuda-graph-backend-prefill") == ["disabled"]
        assert any("--cuda-graph-backend-decode disabled" in n for n in notes)


def test_cuda_graph_off_leaves_the_prefill_graph_backend_to_args_that_choose_it() -> None:
    """A DSA matrix keeps prefill graphs off in every combination through args (seen on the H200, 2026-12-02: the
    graph-off combinations were refused as a clash with the prefill flag cuda_graph=off also sets)."""
    args = ("--cuda-graph-backend-prefill", "disabled")
    argv, _ = plan_for("0.5.15", cuda_graph=CudaGraphSpec(enabled=False), args=args)
    assert flag_value(argv, "--cuda-graph-backend-decode") == ["disabled"]
    assert argv.count("--cuda-graph-backend-prefill") == 1  # the user's, once
    argv, _ = plan_for("0.5.15", cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2)), args=args)
    assert flag_value(argv, "--cuda-graph-backend-prefill") == ["disabled"]


def test_cuda_graph_on_without_sizes_passes_nothing() -> None:
    argv, notes = plan_for("0.5.23", cuda_graph=CudaGraphSpec(enabled=True))
    assert not any("cuda-graph" in a for a in argv)
    assert any("captures decode graphs by default" in n for n in notes)


def test_other_options_map_to_flags() -> None:
    argv, _ = plan_for(
        "0.5.23",
        tp=8,
        attention_backend="fa3",
        prefill_attention_backend="fa3",
        decode_attention_backend="flashinfer",
        max_batch_size=64,
        mem_fraction=0.88,
        deterministic=True,
        served_model_name="glm-5",
        api_key="sk-secret",
        args=("--log-level", "debug"),
    )
    assert flag_value(argv, "--tp-size") == ["8"]
    assert flag_value(argv, "--attention-backend") == ["fa3"]
    assert flag_value(argv, "--prefill-attention-backend") == ["fa3"]
    assert flag_value(argv, "--decode-attention-backend") == ["flashinfer"]
    assert flag_value(argv, "--max-running-requests") == ["64"]
    assert flag_value(argv, "--mem-fraction-static") == ["0.88"]
    assert "--enable-deterministic-inference" in argv
    assert flag_value(argv, "--served-model-name") == ["glm-5"]
    assert flag_value(argv, "--api-key") == ["sk-secret"]
    assert argv[-2:] == ["--log-level", "debug"]  # user args last, verbatim
    plan = SGLangAdapter(flagset_for_version("0.5.23")).launch_plan(spec(api_key="sk-secret"), "::1", 1)
    assert not any("sk-secret" in n for n in plan.notes)
    assert plan.base_url == "http://[::1]:1"


def test_speculative_mapping() -> None:
    argv, _ = plan_for("0.5.9", speculative="EAGLE")
    assert flag_value(argv, "--speculative-algorithm") == ["EAGLE"]
    argv, _ = plan_for(
        "0.5.15",
        speculative='{"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, '
        '"eagle_topk": 1, "num_draft_tokens": 4}',
    )
    assert flag_value(argv, "--speculative-algorithm") == ["EAGLE3"]
    assert flag_value(argv, "--speculative-draft-model-path") == ["/d"]
    assert flag_value(argv, "--speculative-num-steps") == ["3"]
    with pytest.raises(ConfigError, match=r"speculative = 'MEDUSA'.*choices: EAGLE, EAGLE3"):
        plan_for("0.5.9", speculative="MEDUSA")
    with pytest.raises(ConfigError, match=r"speculative.bogus_knob = 1.*no flag.*--speculative-bogus-knob"):
        plan_for("0.5.9", speculative='{"algorithm": "EAGLE", "bogus_knob": 1}')


# --------------------------------------------------------------------------- clear errors


def test_backend_gone_in_a_version_names_option_value_and_version() -> None:
    plan_for("0.5.9", attention_backend="cutlass_mla")  # still there in 0.5.9
    with pytest.raises(ConfigError) as info:
        plan_for("0.5.23", attention_backend="cutlass_mla")
    message = str(info.value)
    assert "attention_backend = 'cutlass_mla'" in message
    assert "SGLang 0.5.23" in message
    assert "--attention-backend" in message
    assert "choices:" in message
    assert "llmserve.toml" in message
    assert "[tool.llmserve.servers.glm]" in message


def test_dsa_value_only_in_newer_version() -> None:
    plan_for("0.5.23", nsa_decode_backend="flashinfer_sparse_mla")
    with pytest.raises(ConfigError, match=r"nsa_decode_backend = 'flashinfer_sparse_mla'.*SGLang 0.5.9"):
        plan_for("0.5.9", nsa_decode_backend="flashinfer_sparse_mla")


def test_option_without_any_flag_in_the_installed_version() -> None:
    old = FlagSet(
        version="0.4.0",
        flags=frozenset({"--model-path", "--host", "--port", "--random-seed", "--disable-cuda-graph"}),
        source="test",
    )
    adapter = SGLangAdapter(old)
    with pytest.raises(ConfigError) as info:
        adapter.launch_plan(spec(nsa_decode_backend="trtllm"), "127.0.0.1", 1)
    assert str(info.value).endswith(
        "nsa_decode_backend = 'trtllm': SGLang 0.4.0 (test) has no flag for it "
        "(looked for --dsa-decode-backend, --nsa-decode-backend)"
    )
    with pytest.raises(
        ConfigError, match=r"deterministic = True: SGLang 0.4.0 .*--enable-deterministic-inference"
    ):
        adapter.launch_plan(spec(deterministic=True), "127.0.0.1", 1)
    with pytest.raises(
        ConfigError, match=r"cuda_graph.batch_sizes = \[1, 2\].*--cuda-graph-bs-decode, --cuda-graph-bs"
    ):
        adapter.launch_plan(spec(cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2))), "127.0.0.1", 1)
    # graphs off still maps on that version
    argv = adapter.launch_plan(spec(cuda_graph=CudaGraphSpec(enabled=False)), "127.0.0.1", 1).argv
    assert "--disable-cuda-graph" in argv
    assert "--enable-metrics" not in argv


def test_args_that_duplicate_a_mapped_option_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"--mem-fraction-static.*mem_fraction"):
        plan_for("0.5.9", mem_fraction=0.9, args=("--mem-fraction-static", "0.8"))
    with pytest.raises(ConfigError, match=r"--random-seed.*seed"):
        plan_for("0.5.9", args=("--random-seed=3",))
    with pytest.raises(ConfigError, match=r"--cuda-graph-bs.*cuda_graph"):  # an alias of the mapped flag
        plan_for(
            "0.5.15", cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1,)), args=("--cuda-graph-bs", "2")
        )


def test_unknown_builtin_version() -> None:
    with pytest.raises(
        ConfigError, match=r"no built-in SGLang flag table for version '0.4.0'.*0.5.9, 0.5.15, 0.5.23"
    ):
        flagset_for_version("0.4.0")
    assert flagset_for_version("v0.5.9").version == "0.5.9"


# --------------------------------------------------------------------------- --help parsing


class _DeprecatedAlias(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)


def sglang_like_help() -> str:
    """A real argparse --help shaped like SGLang 0.5.15's (renamed flags kept as deprecated aliases)."""
    parser = argparse.ArgumentParser(prog="launch_server.py")
    parser.add_argument("--model-path", "--model", required=True, help="The path of the model weights.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--random-seed", type=int)
    parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
    parser.add_argument(
        "--attention-backend",
        choices=["triton", "fa3", "flashinfer", "dsa", "nsa"],
        help="Choose the kernels for attention layers. Also see --decode-attention-backend.",
    )
    group = parser.add_argument_group("CUDA graph")
    group.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", help="Set the list of batch sizes.")
    group.add_argument(
        "--cuda-graph-bs",
        type=int,
        nargs="+",
        action=_DeprecatedAlias,
        help="[Deprecated] Use --cuda-graph-bs-decode instead.",
    )
    group.add_argument("--cuda-graph-backend-decode", choices=["full", "breakable", "disabled"])
    group.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="Disable cuda graph. Deprecated: use --cuda-graph-backend-decode=disabled "
        "and --cuda-graph-backend-prefill=disabled; kept for compatibility with old scripts "
        "that still pass it.",
    )
    group.add_argument("--dsa-decode-backend", choices=["flashmla_kv", "trtllm", "fa3"])
    group.add_argument(
        "--nsa-decode-backend",
        choices=["flashmla_kv", "trtllm", "fa3"],
        help="[Deprecated] Use --dsa-decode-backend instead.",
    )
    parser.add_argument("--enable-metrics", action="store_true", help="Enable log prometheus metrics.")
    return parser.format_help()


def test_flagset_from_help() -> None:
    flagset = flagset_from_help(sglang_like_help(), version="0.5.15")
    assert {
        "--model-path",
        "--model",
        "--tp-size",
        "--tensor-parallel-size",
        "--cuda-graph-bs-decode",
        "--cuda-graph-bs",
        "--disable-cuda-graph",
        "--nsa-decode-backend",
        "--enable-metrics",
    } <= flagset.flags
    assert "--decode-attention-backend" not in flagset.flags  # only mentioned in a help text
    assert "--cuda-graph-backend-prefill" not in flagset.flags  # ditto
    assert flagset.deprecated == {"--cuda-graph-bs", "--disable-cuda-graph", "--nsa-decode-backend"}
    assert flagset.choices_for("--cuda-graph-backend-decode") == ("full", "breakable", "disabled")
    assert flagset.choices_for("--attention-backend") == ("triton", "fa3", "flashinfer", "dsa", "nsa")
    assert flagset.preferred("--cuda-graph-bs-decode", "--cuda-graph-bs") == "--cuda-graph-bs-decode"
    assert flagset.preferred("--nsa-decode-backend") == "--nsa-decode-backend"  # deprecated beats missing
    argv = (
        SGLangAdapter(flagset)
        .launch_plan(spec(nsa_decode_backend="trtllm", cuda_graph=CudaGraphSpec(enabled=False), tp=2), "h", 1)
        .argv
    )
    assert flag_value(argv, "--dsa-decode-backend") == ["trtllm"]
    assert flag_value(argv, "--cuda-graph-backend-decode") == ["disabled"]
    assert "--cuda-graph-backend-prefill" not in argv  # this build has none
    assert flag_value(argv, "--tp-size") == ["2"]


# ------------------------------------------------------------------- detection with a fake interpreter


def fake_python(tmp_path: Path, help_text: str, *, sleep_s: float = 0.0, rc: int = 0) -> tuple[Path, Path]:
    """An executable standing in for SGLang's interpreter; it counts its --help runs."""
    calls = tmp_path / "calls.txt"
    help_file = tmp_path / "help.txt"
    help_file.write_text(help_text, encoding="utf-8")
    script = tmp_path / "python"
    script.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys, time
        args = sys.argv[1:]
        if args[:1] == ["-c"]:
            print("0.5.15")
            sys.exit(0)
        with open({str(calls)!r}, "a") as f:
            f.write("help " + os.environ.get("LLMSERVE_FAKE_MARK", "") + "\\n")
        time.sleep({sleep_s})
        if {rc}:
            print("ModuleNotFoundError: No module named 'sglang'", file=sys.stderr)
            sys.exit({rc})
        print(open({str(help_file)!r}).read())
        """),
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, calls


def test_detect_runs_help_once_per_interpreter(tmp_path: Path) -> None:
    clear_flag_cache()
    python, calls = fake_python(tmp_path, sglang_like_help())
    first = detect_sglang_flags(str(python))
    second = detect_sglang_flags(str(python))
    assert first is second
    assert calls.read_text().count("help") == 1
    assert first.version == "0.5.15"
    assert "--cuda-graph-bs-decode" in first.flags
    assert str(python) in first.source
    plan = SGLangAdapter().launch_plan(
        spec(python=str(python), cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(4,))), "h", 1
    )
    assert flag_value(plan.argv, "--cuda-graph-bs-decode") == ["4"]
    assert calls.read_text().count("help") == 1
    clear_flag_cache()


def test_detect_uses_the_server_env_and_keys_the_cache_by_it(tmp_path: Path) -> None:
    clear_flag_cache()
    python, calls = fake_python(tmp_path, sglang_like_help())
    detect_sglang_flags(str(python), env={"LLMSERVE_FAKE_MARK": "/src/sglang/python"})
    detect_sglang_flags(str(python), env={"LLMSERVE_FAKE_MARK": "/src/sglang/python"})
    detect_sglang_flags(str(python))
    assert calls.read_text().splitlines() == ["help /src/sglang/python", "help "]
    clear_flag_cache()


def test_detect_reports_a_missing_sglang(tmp_path: Path) -> None:
    clear_flag_cache()
    python, _ = fake_python(tmp_path, "", rc=1)
    with pytest.raises(
        ConfigError, match=r"failed \(exit 1\).*No module named 'sglang'.*Is SGLang installed"
    ):
        detect_sglang_flags(str(python))


def test_detect_times_out(tmp_path: Path) -> None:
    clear_flag_cache()
    python, _ = fake_python(tmp_path, sglang_like_help(), sleep_s=5)
    with pytest.raises(ServerStartError, match="did not finish within 0.5 s"):
        detect_sglang_flags(str(python), timeout_s=0.5)


def test_detect_reports_a_missing_interpreter(tmp_path: Path) -> None:
    clear_flag_cache()
    with pytest.raises(ConfigError, match="cannot run SGLang's interpreter"):
        detect_sglang_flags(os.fspath(tmp_path / "nope" / "python"))


# --------------------------------------------------------------------------- facts through the adapter


def test_parse_facts_combines_log_metrics_and_server_info() -> None:
    adapter = SGLangAdapter(flagset_for_version("0.5.9"))
    log = (LOGS / "sglang_0.5.9.log").read_text(encoding="utf-8")
    metrics = (
        'sglang:cuda_graph_passes_total{mode="decode_cuda_graph",tp_rank="0"} 300\n'
        'sglang:cuda_graph_passes_total{mode="decode_none",tp_rank="0"} 2\n'
    )
    facts = adapter.parse_facts(log, metrics, {"version": "0.5.9", "random_seed": 99})
    assert facts.engine == "sglang"
    assert facts.version == "0.5.9"  # only /server_info says it
    assert facts.seed == 0  # the log's value wins
    assert facts.graph_passes == {"decode_cuda_graph": 300.0, "decode_none": 2.0}
    checks = {
        r.name: r
        for r in adapter.check_execution(
            spec(cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8)), attention_backend="fa3"),
            facts,
        )
    }
    assert checks["cuda_graph.captured"].status == "pass"
    assert checks["cuda_graph.used_in_decode"].status == "pass"
    assert checks["attention_backend"].status == "pass"
    assert checks["seed"].status == "pass"


# ---------------------------------------------------------------------- kernels that cannot run here


H200 = [("GPU 0 (NVIDIA H200)", "9.0")]


def test_trtllm_dsa_backend_is_refused_before_boot_on_hopper() -> None:
    """SGLang's trtllm DSA backend runs flashinfer's trtllm-gen kernels, built for SM100/SM103 only: on an H200 the
    boot would fail late (or not at all on some paths); the preflight names the option, its file and the GPU."""
    adapter = SGLangAdapter(flagset_for_version("0.5.15"))
    problems = adapter.preflight_problems(spec(nsa_decode_backend="trtllm"), H200)
    assert len(problems) == 1
    assert "nsa_decode_backend = 'trtllm'" in problems[0] and "SM100/SM103" in problems[0]
    assert "GPU 0 (NVIDIA H200) has compute capability 9.0" in problems[0]
    assert adapter.preflight_problems(spec(nsa_decode_backend="trtllm"), [("GPU 0 (NVIDIA B200)", "10.0")]) == []
    # Unknown capability: nothing can be said before the boot, which then tells.
    assert adapter.preflight_problems(spec(nsa_decode_backend="trtllm"), [("GPU 0 (?)", None)]) == []
    assert adapter.preflight_problems(spec(nsa_decode_backend="flashmla_kv"), H200) == []


def test_fa3_is_refused_where_sgl_kernel_has_no_flash_ops(tmp_path: Path) -> None:
    """The FA3 kernels (sgl_kernel's flash_ops.abi3.so, 1.76 GB) are what a slimmed install leaves out; the check
    asks the server's own python, with the server's environment, where its sgl_kernel is."""
    kernel = tmp_path / "site" / "sgl_kernel"
    kernel.mkdir(parents=True)
    (kernel / "__init__.py").write_text("raise ImportError('never imported by the check')\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    adapter = SGLangAdapter(flagset_for_version("0.5.15"))
    fa3 = spec(nsa_decode_backend="fa3", python=sys.executable, env=tuple(env.items()))
    problems = adapter.preflight_problems(fa3, H200)
    assert len(problems) == 1
    assert "nsa_decode_backend = 'fa3'" in problems[0] and "flash_ops.abi3.so" in problems[0]
    assert str(kernel) in problems[0]
    (kernel / "flash_ops.abi3.so").write_bytes(b"")
    assert adapter.preflight_problems(fa3, H200) == []
    # No sgl_kernel at all for that python: the boot's own error says more than a guess here.
    assert adapter.preflight_problems(spec(nsa_decode_backend="fa3", python=sys.executable), H200) == []

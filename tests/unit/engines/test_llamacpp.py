"""llama.cpp adapter: argv and environment from the configuration, facts from recorded and rebuilt
logs, /metrics, /props and /slots, and the config-is-execution checks built on them."""

# Log lines are quoted verbatim, whatever their length.
# ruff: noqa: E501

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines import adapter_for
from pytest_llmserve.engines.llamacpp.facts import (
    LlamaCppFacts,
    check_llamacpp_execution,
    merge_llamacpp_metrics,
    parse_llamacpp,
    parse_llamacpp_log,
    parse_llamacpp_props,
)
from pytest_llmserve.engines.llamacpp.launch import GRAPHS_ENV, LlamaCppAdapter, find_llama_server
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.evidence.facts import ServerFacts

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
BIN = "/opt/llama.cpp/bin/llama-server"


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def spec(**kwargs: object) -> ServerSpec:
    base: dict[str, object] = {
        "name": "lc",
        "engine": "llamacpp",
        "model": "/models/smollm2.gguf",
        "argv": (BIN,),
        "source": "llmserve.toml",
    }
    base.update(kwargs)
    return ServerSpec(**base)  # type: ignore[arg-type]


def plan(**kwargs: object) -> tuple[list[str], dict[str, str], list[str]]:
    p = LlamaCppAdapter().launch_plan(spec(**kwargs), "127.0.0.1", 8080)
    return p.argv, p.env, p.notes


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    monkeypatch.delenv("LLAMA_SERVER", raising=False)


# --------------------------------------------------------------------------- argv


def test_adapter_for_routes_llamacpp() -> None:
    assert isinstance(adapter_for(spec()), LlamaCppAdapter)


def test_minimal_plan() -> None:
    p = LlamaCppAdapter().launch_plan(spec(), "127.0.0.1", 8080)
    # Verbosity first: -ngl starts the CUDA backend while flags are parsed, and its device lines
    # are printed only if the threshold is already 4.
    assert p.argv[:5] == [BIN, "-lv", "4", "-m", "/models/smollm2.gguf"]
    assert value(p.argv, "--host") == "127.0.0.1" and value(p.argv, "--port") == "8080"
    assert value(p.argv, "--seed") == "0"
    assert "--metrics" in p.argv and p.argv.count("-lv") == 1
    for absent in ("-np", "-c", "-ngl", "-fa", "--split-mode"):
        assert absent not in p.argv
    assert p.env == {}
    assert p.health_path == "/health" and p.generation_probe
    assert p.base_url == "http://127.0.0.1:8080" and p.model_name == "smollm2.gguf"


def test_every_logical_option() -> None:
    argv, env, notes = plan(
        parallel=16,
        context_size=32768,
        gpu_layers=99,
        flash_attention=True,
        seed=7,
        gpu=True,
        served_model_name="smol",
        api_key="sk-x",
        cuda_graph=CudaGraphSpec(enabled=True),
    )
    assert value(argv, "-np") == "16" and value(argv, "-c") == "32768" and value(argv, "-ngl") == "99"
    assert value(argv, "-fa") == "on" and value(argv, "--seed") == "7"
    assert value(argv, "--split-mode") == "none"  # tp = 1 on a GPU: one device, not all visible ones
    assert value(argv, "--alias") == "smol" and env["LLAMA_API_KEY"] == "sk-x"
    assert "--api-key" not in argv and "sk-x" not in " ".join(argv)  # a command-line key shows in ps
    assert GRAPHS_ENV not in env
    assert any("cuda_graph=on -> nothing to pass" in n for n in notes)


def test_flash_attention_off_and_graphs_off_through_the_environment() -> None:
    argv, env, notes = plan(flash_attention=False, cuda_graph=CudaGraphSpec(enabled=False), env=(("A", "1"),))
    assert value(argv, "-fa") == "off"
    assert env == {"A": "1", GRAPHS_ENV: "1"}
    assert any("GGML_CUDA_DISABLE_GRAPHS=1" in n and "unverifiable" in n for n in notes)


def test_graphs_on_refused_when_the_environment_disables_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRAPHS_ENV, "0")  # any value disables them: ggml-cuda only checks it exists
    with pytest.raises(ConfigError, match="GGML_CUDA_DISABLE_GRAPHS='0' is set .*unset it"):
        plan(cuda_graph=CudaGraphSpec(enabled=True))
    with pytest.raises(ConfigError, match="in env"):
        plan(cuda_graph=CudaGraphSpec(enabled=True), env=((GRAPHS_ENV, "1"),))


def test_tensor_split_over_n_gpus() -> None:
    argv, _, notes = plan(tp=2, gpu=True)
    assert value(argv, "--split-mode") == "layer" and value(argv, "--tensor-split") == "1,1"
    assert argv.count("--split-mode") == 1
    assert any("not tensor parallelism" in n for n in notes)


def test_max_batch_size_means_slots() -> None:
    argv, _, _ = plan(max_batch_size=8)
    assert value(argv, "-np") == "8"
    argv, _, _ = plan(max_batch_size=8, parallel=8)
    assert value(argv, "-np") == "8"
    with pytest.raises(ConfigError, match="parallel = 4 and max_batch_size = 8 disagree"):
        plan(max_batch_size=8, parallel=4)


def test_user_args_come_last_and_may_set_verbosity_and_metrics() -> None:
    argv, _, notes = plan(args=("-lv", "5", "--metrics", "--no-webui"))
    assert argv[-4:] == ["-lv", "5", "--metrics", "--no-webui"]
    assert argv[1:3] == ["-lv", "5"]  # the user's level, also first
    assert argv.count("--metrics") == 1
    assert any("-lv 5 from args" in n for n in notes)
    argv, _, _ = plan(args=("--verbosity=5",))
    assert argv[1:3] == ["-lv", "5"] and argv[-1] == "--verbosity=5"


@pytest.mark.parametrize(
    "flag", ["-c", "--ctx-size", "-ngl", "-fa", "--port", "-np", "--seed", "--flash-attn=on"]
)
def test_args_that_clash_with_options_are_refused(flag: str) -> None:
    with pytest.raises(ConfigError, match="set the option, not the flag"):
        plan(args=(flag, "1"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attention_backend": "fa3"}, "no attention backend choice; use flash_attention"),
        ({"cuda_graph": CudaGraphSpec(enabled=True, batch_sizes=(1, 2))}, "has no capture sizes"),
        ({"cuda_graph": CudaGraphSpec(enabled=True, max_batch_size=8)}, "has no capture sizes"),
        ({"eager": True}, "use cuda_graph = false"),
        ({"mem_fraction": 0.9}, "no memory fraction"),
        ({"deterministic": True}, "no batch-invariant mode"),
        ({"speculative": "draft"}, "needs a draft model"),
        ({"args": ("-md", "/d.gguf")}, "speculative is unset"),
    ],
)
def test_options_without_a_llamacpp_equivalent(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(**kwargs)


def test_speculative_with_a_draft_model() -> None:
    argv, _, _ = plan(speculative="draft", args=("-md", "/d.gguf"))
    assert argv[-2:] == ["-md", "/d.gguf"]


def test_model_is_required() -> None:
    with pytest.raises(ConfigError, match="needs model"):
        LlamaCppAdapter().launch_plan(spec(model=None), "127.0.0.1", 1)


def test_binary_lookup_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert find_llama_server(spec()) == [BIN]
    monkeypatch.setenv("LLAMA_SERVER", "/env/llama-server")
    assert find_llama_server(spec(argv=())) == ["/env/llama-server"]
    monkeypatch.delenv("LLAMA_SERVER")
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYTEST_LLMSERVE_CACHE", str(tmp_path / "cache"))
    assert find_llama_server(spec(argv=())) == [str(fake)]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_llama_server(spec(argv=())) is None
    with pytest.raises(ConfigError, match="no llama-server found"):
        LlamaCppAdapter().launch_plan(spec(argv=()), "127.0.0.1", 1)
    built = tmp_path / "cache" / "llama.cpp-0.3.36" / "build-cpu" / "bin" / "llama-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert find_llama_server(spec(argv=())) == [str(built)]


def test_adapter_is_never_deterministic() -> None:
    assert LlamaCppAdapter().deterministic_flag_on(spec()) is False
    assert LlamaCppAdapter.generation_counter == "llamacpp:tokens_predicted_total"


# --------------------------------------------------------------------------- facts from logs

REAL_LV4 = "real_llamacpp_cpu_0.3.36_lv4.log"
REAL_LV5 = "real_llamacpp_cpu_0.3.36_lv5_excerpt.log"
CUDA_LV4 = "llamacpp_cuda_h200_lv4.log"


def gpu_spec(**kwargs: object) -> ServerSpec:
    base: dict[str, object] = {
        "gpu": True,
        "gpu_layers": 99,
        "context_size": 32768,
        "parallel": 16,
        "flash_attention": True,
    }
    base.update(kwargs)
    return spec(**base)


def results(s: ServerSpec, facts: ServerFacts) -> dict[str, str]:
    return {r.name: r.status for r in check_llamacpp_execution(s, facts)}


def test_real_cpu_log_at_default_verbosity() -> None:
    """Recorded from the CPU build: every fact the adapter relies on is in the log at -lv 4."""
    facts = parse_llamacpp_log(read(REAL_LV4))
    assert isinstance(facts, LlamaCppFacts) and facts.engine == "llamacpp"
    assert facts.version == facts.build_info == "b1-0c1e570"
    assert facts.verbosity == 4
    assert facts.backends == ("CPU",) and facts.cuda_archs is None
    assert facts.cuda_graphs_compiled is False  # no CUDA backend: graphs impossible
    assert facts.gpu_offload_supported is False and facts.offloaded_layers == 0  # "-ngl 99" ignored
    assert facts.flash_attention_type == "disabled" and facts.flash_attention is False
    assert (facts.n_ctx, facts.n_ctx_slot, facts.n_parallel, facts.max_batch_size) == (4096, 2048, 2, 2)
    assert facts.kv_unified is False
    assert facts.kv_cache_mib == 90.0 and facts.kv_cache_tokens == 4096  # 2048 cells x 2 streams
    assert facts.model_buffers == {"CPU_Mapped": 92.1}
    assert facts.model_path and facts.model_path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert facts.ready is True and facts.startup_s == pytest.approx(18.078, abs=0.01)
    assert facts.errors == [] and facts.nan_events == []
    assert facts.debug_lines == 0 and facts.graph_warmups == 0
    assert facts.speculative is False  # "no implementations specified for speculative decoding"
    assert "system_info: n_threads = 2" in facts.evidence["cuda_graphs_compiled"][0]
    assert "offloaded" not in " ".join(facts.evidence.get("offloaded_layers", []))
    assert "no usable GPU found" in facts.evidence["offloaded_layers"][0]


def test_real_cpu_log_at_debug_verbosity_counts_decode_and_library_debug_lines() -> None:
    facts = parse_llamacpp_log(read(REAL_LV5))
    assert facts.verbosity == 5
    assert facts.debug_decode_tokens == 18  # 1 + 1 + 8 + 8 tokens generated, one debug line each
    assert facts.library_debug_lines > 0 and facts.debug_lines > facts.library_debug_lines
    assert facts.evidence["library_debug_lines"]  # the first libllama debug line, kept as proof
    assert facts.nan_events == []  # token text in debug lines is not NaN evidence


def test_reconstructed_cuda_log() -> None:
    facts = parse_llamacpp_log(read(CUDA_LV4))
    assert facts.backends == ("CUDA", "CPU") and facts.cuda_archs == ("900",)
    assert facts.cuda_graphs_compiled is True
    assert facts.gpus == [
        {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "vmm": True, "vram_mib": 143771}
    ]
    assert facts.devices_used == ("CUDA0",)
    assert (facts.offloaded_layers, facts.total_layers) == (31, 31)
    assert facts.flash_attention is True and facts.flash_attention_type == "enabled"
    assert (facts.n_ctx, facts.n_parallel, facts.kv_cache_tokens) == (32768, 16, 32768)
    assert facts.model_buffers["CUDA0"] == 92.1
    assert facts.cuda_graph_enabled is None  # nothing about graph use at -lv 4


def test_two_gpu_split_log() -> None:
    facts = parse_llamacpp_log(read("llamacpp_cuda_h200x2_split_lv4.log"))
    assert facts.devices_used == ("CUDA0", "CUDA1")
    assert [g["index"] for g in facts.gpus] == [0, 1]
    assert {"CUDA0", "CUDA1"} <= set(facts.model_buffers)
    checks = results(gpu_spec(tp=2, cuda_graph=CudaGraphSpec(enabled=True)), facts)
    assert checks["tp.devices"] == "pass"
    assert results(gpu_spec(tp=1), facts)["tp.devices"] == "fail"  # asked for one GPU, ran on two


def test_graph_lines_at_debug_verbosity() -> None:
    on = parse_llamacpp_log(read("llamacpp_cuda_h200_lv5_graphs_on.log"))
    assert on.cuda_graph_enabled is True and on.graph_warmups == 1 and on.graph_reuses > 0
    assert "CUDA graph warmup complete" in on.evidence["cuda_graph_enabled"][0]
    off = parse_llamacpp_log(read("llamacpp_cuda_h200_lv5_graphs_off.log"))
    assert off.cuda_graph_enabled is None and off.graph_warmups == off.graph_reuses == 0
    assert off.debug_decode_tokens == 18 and off.library_debug_lines > 0


def test_flash_attention_auto_resolution_and_forced_switches() -> None:
    base = "0.00.448.428 I llama_context: flash_attn            = auto\n"
    on = parse_llamacpp_log(base + "0.00.541.196 I resolve_fused_ops: Flash Attention enabled\n")
    assert on.flash_attention_type == "auto" and on.flash_attention is True
    off = parse_llamacpp_log(
        base + "0.00.541.196 W resolve_fused_ops: Flash Attention not supported, set to disabled\n"
    )
    assert off.flash_attention is False
    assert parse_llamacpp_log(base).flash_attention is None  # auto, never resolved: not reported
    forced = parse_llamacpp_log(
        "0.00.448.428 I llama_context: flash_attn            = disabled\n"
        "0.00.448.500 I llama_init_from_model: enabling flash_attn since it is required "
        "for quantized V cache\n"
    )
    assert forced.flash_attention is True
    check = results(spec(flash_attention=True), on)
    assert check["flash_attention"] == "pass"
    observed = {r.name: r.observed for r in check_llamacpp_execution(spec(flash_attention=True), on)}
    assert observed["flash_attention"] == "on (auto, resolved at load)"


def test_errors_and_unified_kv() -> None:
    text = (
        "0.00.448.582 I llama_kv_cache: size =   90.00 MiB (  4096 cells,  30 layers,  4/1 seqs), K (f16):   "
        "45.00 MiB, V (f16):   45.00 MiB\n"
        "0.00.500.000 E llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within "
        "the file bounds\n"
        "/src/ggml-cuda.cu:97: CUDA error\n"
    )
    facts = parse_llamacpp_log(text)
    assert facts.kv_cache_tokens == 4096  # unified: one stream of 4096 cells
    assert len(facts.errors) == 2


def test_plugin_header_is_not_a_fact() -> None:
    header = '# llmserve launch {"argv": ["llama-server", "-fa", "on", "flash_attn = enabled"]}\n'
    assert parse_llamacpp_log(header).flash_attention is None


# --------------------------------------------------------------------------- /metrics, /props, /slots


def test_metrics_props_and_slots_recorded_from_the_cpu_server() -> None:
    facts = parse_llamacpp_log("")
    merge_llamacpp_metrics(facts, read("real_llamacpp_cpu_0.3.36_metrics.txt"))
    assert facts.tokens_predicted == 10 and facts.n_decode == 10
    assert facts.speculative is None  # zero drafts proves nothing: /slots says it
    info = json.loads(read("real_llamacpp_cpu_0.3.36_server_info.json"))
    props = parse_llamacpp_props(info)
    assert props.build_info == "b1-0c1e570" and props.seed == 0
    assert props.n_parallel == 2 and props.n_ctx_slot == 2048
    assert props.speculative is False  # every slot reports "speculative": false
    assert props.evidence["seed"] == ["/props default_generation_settings.params.seed = 0"]
    assert parse_llamacpp_props({}).seed is None


def test_parse_llamacpp_combines_log_metrics_and_props() -> None:
    info = json.loads(read("real_llamacpp_cpu_0.3.36_server_info.json"))
    facts = parse_llamacpp(read(REAL_LV4), read("real_llamacpp_cpu_0.3.36_metrics.txt"), info)
    assert facts.seed == 0 and facts.speculative is False and facts.tokens_predicted == 10
    assert facts.n_parallel == 2  # the log's value; /props agrees
    adapter_facts = LlamaCppAdapter().parse_facts(read(REAL_LV4), None, info)
    assert isinstance(adapter_facts, LlamaCppFacts) and adapter_facts.seed == 0
    assert json.dumps(facts.to_dict())  # JSON-able for reports


def test_real_responses_parse_with_the_client() -> None:
    """llama-server answers logprobs in the chat "content" form on /v1/completions too."""
    from pytest_llmserve.evidence.client import parse_completion_choice

    data = json.loads(read("real_llamacpp_cpu_0.3.36_completion.json"))
    _, tokens, finish, _ = parse_completion_choice(data["choices"][0])
    assert finish == "stop" and len(tokens) == data["usage"]["completion_tokens"] == 1
    assert tokens[0].logprob == pytest.approx(-0.2799, abs=1e-3) and len(tokens[0].top) == 3
    chat = json.loads(read("real_llamacpp_cpu_0.3.36_chat.json"))
    _, chat_tokens, _, _ = parse_completion_choice({**chat["choices"][0], "text": ""})
    assert chat_tokens and all(t.logprob is not None for t in chat_tokens)


# --------------------------------------------------------------------------- config is execution


def test_checks_on_the_real_cpu_log() -> None:
    info = json.loads(read("real_llamacpp_cpu_0.3.36_server_info.json"))
    facts = parse_llamacpp(read(REAL_LV4), read("real_llamacpp_cpu_0.3.36_metrics.txt"), info)
    s = spec(
        parallel=2,
        context_size=4096,
        gpu_layers=99,
        flash_attention=False,
        cuda_graph=CudaGraphSpec(enabled=False),
    )
    assert results(s, facts) == {
        "speculative": "pass",
        "seed": "pass",
        "cuda_graph.used_in_decode": "pass",  # a CPU build cannot use CUDA graphs
        "flash_attention": "pass",
        "gpu_layers": "fail",  # -ngl 99 asked, the CPU build offloaded nothing
        "context_size": "pass",
        "parallel": "pass",
    }
    assert results(spec(gpu_layers=0), facts)["gpu_layers"] == "pass"


def test_graphs_requested_on_against_a_build_without_cuda() -> None:
    facts = parse_llamacpp_log(read(REAL_LV4))
    checks = results(spec(cuda_graph=CudaGraphSpec(enabled=True)), facts)
    assert checks["cuda_graph.compiled"] == "fail" and checks["cuda_graph.used_in_decode"] == "fail"


def test_graphs_on_at_default_verbosity_is_unverifiable_use() -> None:
    facts = parse_llamacpp_log(read(CUDA_LV4))
    checks = check_llamacpp_execution(gpu_spec(cuda_graph=CudaGraphSpec(enabled=True)), facts)
    by_name = {r.name: r for r in checks}
    assert by_name["cuda_graph.compiled"].status == "pass"
    assert by_name["cuda_graph.used_in_decode"].status == "unverifiable"
    assert "-lv', '5'" in by_name["cuda_graph.used_in_decode"].note
    assert all(
        by_name[n].status == "pass"
        for n in ("flash_attention", "gpu_layers", "context_size", "parallel", "tp.devices")
    )


def test_graphs_off_by_environment_is_unverifiable_never_pass_at_default_verbosity() -> None:
    facts = parse_llamacpp_log(read("llamacpp_cuda_h200_lv4_fa_off_graphs_off.log"))
    checks = {
        r.name: r
        for r in check_llamacpp_execution(
            gpu_spec(flash_attention=False, cuda_graph=CudaGraphSpec(enabled=False)), facts
        )
    }
    graph = checks["cuda_graph.used_in_decode"]
    assert graph.status == "unverifiable"
    assert "GGML_CUDA_DISABLE_GRAPHS leave no log line" in graph.note
    assert "cuda_graph.compiled" not in checks  # compiled-in says nothing when "off" is asked
    assert checks["flash_attention"].status == "pass"


def test_graph_use_is_provable_both_ways_at_debug_verbosity() -> None:
    on = parse_llamacpp_log(read("llamacpp_cuda_h200_lv5_graphs_on.log"))
    off = parse_llamacpp_log(read("llamacpp_cuda_h200_lv5_graphs_off.log"))
    want_on = gpu_spec(cuda_graph=CudaGraphSpec(enabled=True), args=("-lv", "5"))
    want_off = gpu_spec(cuda_graph=CudaGraphSpec(enabled=False), args=("-lv", "5"))
    assert results(want_on, on)["cuda_graph.used_in_decode"] == "pass"
    assert results(want_off, off)["cuda_graph.used_in_decode"] == "pass"
    # ...and the opposite request fails on each log.
    assert results(want_off, on)["cuda_graph.used_in_decode"] == "fail"
    assert results(want_on, off)["cuda_graph.used_in_decode"] == "fail"
    evidence = {r.name: r for r in check_llamacpp_execution(want_off, off)}["cuda_graph.used_in_decode"]
    assert "no graph captured in 18 decoded tokens" in evidence.observed
    assert any("n_gen = " in line for line in evidence.evidence)


def test_absence_needs_enough_decoded_tokens() -> None:
    off = parse_llamacpp_log(read("llamacpp_cuda_h200_lv5_graphs_off.log"))
    off.debug_decode_tokens = 3
    result = {
        r.name: r for r in check_llamacpp_execution(gpu_spec(cuda_graph=CudaGraphSpec(enabled=False)), off)
    }["cuda_graph.used_in_decode"]
    assert result.status == "unverifiable" and "decode too short" in result.note


def test_unreported_facts_are_unverifiable() -> None:
    facts = parse_llamacpp_log("")
    checks = results(gpu_spec(tp=2, cuda_graph=CudaGraphSpec(enabled=True)), facts)
    assert set(checks.values()) == {"unverifiable"}, checks


def test_context_may_be_padded_but_not_shrunk() -> None:
    facts = parse_llamacpp_log("0.00.448.405 I llama_context: n_ctx                 = 4352\n")
    assert results(spec(context_size=4100), facts)["context_size"] == "pass"
    assert results(spec(context_size=8192), facts)["context_size"] == "fail"


def test_generic_facts_promote_to_llamacpp_facts() -> None:
    plain = ServerFacts(engine="llamacpp", seed=0)
    assert results(spec(), plain)["seed"] == "pass"


def test_client_tokenize_speaks_llama_server() -> None:
    """llama-server's /tokenize reads "content"; with only "prompt" it answers 200 {"tokens": []}."""
    import httpx

    from pytest_llmserve.evidence.client import LLMClient

    seen: list[dict[str, object]] = []

    def llama_server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        tokens = [19556, 905] if "content" in body else []
        return httpx.Response(200, json={"tokens": tokens})

    client = LLMClient("http://llama", "m")
    client._http = httpx.Client(base_url="http://llama", transport=httpx.MockTransport(llama_server))
    assert client.tokenize("Hello world") == [19556, 905]  # recorded from the CPU server
    assert seen[-1] == {"content": "Hello world", "add_special": False}
    assert client.tokenize("") == []  # empty text: no retry
    assert len(seen) == 3

    def vllm(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"tokens": [1, 2], "count": 2})

    seen.clear()
    client._http = httpx.Client(base_url="http://vllm", transport=httpx.MockTransport(vllm))
    assert client.tokenize("Hello world") == [1, 2] and len(seen) == 1  # one request, as before

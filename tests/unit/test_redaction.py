"""Secrets masked in one place (:mod:`pytest_llmserve.redaction`): each site that shows or stores a record a secret
may be in gets a planted secret, and what it shows or stores must hold the mask and never the secret. A site that
stops redacting (calls around the module, or drops the call) fails here."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.engines import engine_environment
from pytest_llmserve.engines.sglang.launch import SGLangAdapter, flagset_for_version
from pytest_llmserve.gates.context import build_context, server_args
from pytest_llmserve.redaction import (
    MASK,
    find_secrets,
    is_secret_name,
    redact_argv,
    redact_context,
    redact_env,
    redact_text,
    secret_strings,
)
from pytest_llmserve.server.handle import ServerHandle, secret_values
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from tests.unit.contexts import HW, spec

SECRET = "sk-planted-" + uuid.uuid4().hex


def _public_api_key(_: Path) -> str:
    return repr(spec(api_key=SECRET).public_dict())


def _public_env(_: Path) -> str:
    return repr(spec(env=(("HF_TOKEN", SECRET), ("OMP_NUM_THREADS", "2"))).public_dict())


def _public_args(_: Path) -> str:
    return repr(spec(args=("--api-key", SECRET, f"--hf-token={SECRET}"), argv=("--token", SECRET)).public_dict())


def _context_server_args(_: Path) -> str:
    return json.dumps(server_args(spec(api_key=SECRET, args=("--api-key", SECRET))))


def _context_extra(_: Path) -> str:
    # A key added to the context (a secret-named value, a command line nested in a list of dicts).
    ctx = build_context(spec(), Workload("w"), engine_version="1", hardware=HW, plugin_version="0", python="3",
                        environ={}, extra={"OPENAI_API_KEY": SECRET, "runs": [{"argv": ["x", "--api-key", SECRET]}]})
    return json.dumps(ctx)


def _context_inherited_env(_: Path) -> str:
    # The shell variables a launched engine inherits and reads (vLLM's prefix): VLLM_API_KEY among them.
    ctx = build_context(spec(), Workload("w"), engine_version="1", hardware=HW, plugin_version="0", python="3",
                        environ={"VLLM_API_KEY": SECRET, "VLLM_CPU_KVCACHE_SPACE": "2"})
    return json.dumps(ctx)


def _engine_environment(_: Path) -> str:
    return repr(engine_environment(spec(), {"VLLM_API_KEY": SECRET, "HF_TOKEN": SECRET, "VLLM_LOGGING_LEVEL": "x"}))


def _sglang_launch_shown(_: Path) -> str:
    # What a launch shows (the log's launch line: its argv redacted, its notes): the key is only in the argv run.
    s = ServerSpec(name="g", engine="sglang", model="/m", api_key=SECRET)
    plan = SGLangAdapter(flagset_for_version("0.5.23")).launch_plan(s, "127.0.0.1", 30000)
    assert SECRET in plan.argv  # the engine needs it...
    return repr((redact_argv(plan.argv), plan.notes))  # ...nothing shown has it


def _log_tail(tmp: Path) -> str:
    # A server that echoes its key, its secret flag's value and an inherited token into its log.
    handle = ServerHandle(spec(api_key=SECRET, args=("--hf-token", SECRET + "-flag"),
                               env=(("HF_TOKEN", SECRET + "-env"),)), log_dir=tmp)
    handle.log_path = tmp / "server.log"
    handle.log_path.write_text(f"args: --api-key {SECRET}\nflag {SECRET}-flag\nenv {SECRET}-env\nready\n")
    return handle._tail()


def _log_tail_as_report_hooks_reads_it(tmp: Path) -> str:
    # report_hooks.py masks a dead server's log tail with handle.secret_values + redact_text.
    s = spec(api_key=SECRET)
    return redact_text(f"INFO key={SECRET}\n", secret_values(s))


def _stored_baseline(tmp: Path) -> str:
    store = BaselineStore(tmp / "baselines")
    context = {"engine": "vllm", "server_args": {"api_key": SECRET, "args": ["--api-key", SECRET]},
               "extra": {"HF_TOKEN": SECRET}}
    doc = store.save(BenchKey("t", "s", "w"), context, {"output_throughput": [1.0, 2.0]},
                     metric="output_throughput", higher_is_better=True)
    assert doc.path is not None
    return doc.path.read_text()


SITES: list[Callable[[Path], str]] = [
    _public_api_key, _public_env, _public_args, _context_server_args, _context_extra, _context_inherited_env,
    _engine_environment, _sglang_launch_shown, _log_tail, _log_tail_as_report_hooks_reads_it, _stored_baseline]


@pytest.mark.parametrize("site", SITES, ids=lambda f: f.__name__.strip("_"))
def test_a_planted_secret_is_masked_at_every_site_that_shows_or_stores_it(tmp_path: Path,
                                                                          site: Callable[[Path], str]) -> None:
    shown = site(tmp_path)
    assert SECRET not in shown
    assert MASK in shown


def test_the_rules() -> None:
    assert is_secret_name("HF_TOKEN") and is_secret_name("vllm_api_key") and not is_secret_name("TOKENIZERS_PARALLELISM")
    assert redact_argv(["--api-key", "k", "--port", "1", "--token=t"]) == ["--api-key", MASK, "--port", "1",
                                                                            "--token=" + MASK]
    assert redact_env([("HF_TOKEN", "x"), ("OMP_NUM_THREADS", "2")]) == {"HF_TOKEN": MASK, "OMP_NUM_THREADS": "2"}
    # Values shorter than 8 characters are not looked for in free text ("on", "1" would mask half a log).
    assert secret_strings("short", ["--api-key", "a-long-secret"], {"HF_TOKEN": "hf_longer_token"}) == [
        "hf_longer_token", "a-long-secret"]
    ctx = {"server_args": {"api_key": "k"}, "tokenizer": "gpt2", "extra": {"PASSWORD": "p"}}
    assert redact_context(ctx) == {"server_args": {"api_key": MASK}, "tokenizer": "gpt2", "extra": {"PASSWORD": MASK}}
    assert find_secrets(ctx) == ["server_args.api_key", "extra.PASSWORD"]
    assert redact_context(redact_context(ctx)) == redact_context(ctx) and find_secrets(redact_context(ctx)) == []

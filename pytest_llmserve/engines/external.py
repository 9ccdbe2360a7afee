"""``external``: a server that is already running elsewhere (``url = ...`` or ``--llmserve-url``).

Nothing is launched or killed; readiness is still checked (/health, then one generation).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_llmserve import engine_registry
from pytest_llmserve.config import ServerSpec
from pytest_llmserve.engines import adapter_for_metrics, adapter_named
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan
from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.evidence.pages import read_page


class ExternalAdapter(EngineAdapter):
    name = "external"
    launches = False

    def __init__(self) -> None:
        # The engine behind a URL is unknown: its NaN counters may be any engine's.
        engines = [name for name in engine_registry.ADAPTERS if name not in ("external", "command")]
        self.nan_counters = tuple(counter for engine in engines for counter in adapter_named(engine).nan_counters)

    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        assert spec.url
        model = spec.served_model_name or spec.model or _first_model(spec.url, spec.api_key) or "default"
        return LaunchPlan(argv=[], env={}, base_url=spec.url.rstrip("/").removesuffix("/v1"), model_name=model,
                          health_path="/health", generation_probe=True)

    def parse_facts(self, log_text: str, metrics_text: str | None = None,
                    server_info: Mapping[str, object] | None = None) -> ServerFacts:
        out = ServerFacts(engine="external")
        engine = adapter_for_metrics(metrics_text) if metrics_text else None
        if engine is not None and metrics_text:
            engine.merge_metrics(out, metrics_text)
        return out


def _first_model(url: str, api_key: str | None) -> str | None:
    """The first model ``/v1/models`` lists; None for any failure ("unknown": readiness reports the real problem)."""
    models = read_page(url, "/v1/models", api_key).json()
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    return str(first["id"]) if isinstance(first, dict) and "id" in first else None

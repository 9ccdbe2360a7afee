"""``command``: any argv that serves the OpenAI API. ``{port}``, ``{host}`` and ``{model}`` are filled in.

Readiness: ``/health`` if it answers 200 (many servers have it), then one real generation.
"""

from __future__ import annotations

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan


class CommandAdapter(EngineAdapter):
    name = "command"

    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        values = {"port": str(port), "host": host, "model": spec.model or ""}
        argv = [part.format(**values) for part in spec.argv] + list(spec.args)
        model = spec.served_model_name or spec.model or "default"
        return LaunchPlan(argv=argv, env=dict(spec.env), base_url=f"http://{host}:{port}", model_name=model,
                          health_path="/health", generation_probe=True)

"""The load generator: fixed-length workload prompts, streamed requests, one definition per metric.

``prompts`` builds seeded prompts of exactly ``input_len`` tokens; ``transport`` sends them (the lean
HTTP/1.1 + SSE client, or httpx) and timestamps every chunk; ``runner`` schedules and runs a workload,
in one or several client processes; ``metrics`` turns the per-request records into the run's figures
and decides whether the run is a measurement at all.
"""

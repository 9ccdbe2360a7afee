"""Benchmark reports, all made from :class:`~pytest_llmserve.report.outcome.BenchOutcome` records.

outcome (the record and its construction from the gate), text (terminal table, Markdown summary),
json (results.json), benchmark_json (pytest-benchmark compatible export), plots (PNG, optional matplotlib),
session (every report of a session in one call).
"""

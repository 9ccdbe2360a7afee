"""Test-suite conftest: pytester for plugin tests, and the embedded default's readiness for e2e tests."""

from __future__ import annotations

pytest_plugins = ["pytester"]

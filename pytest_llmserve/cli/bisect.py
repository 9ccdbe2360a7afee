"""``llmserve builds compare A B`` and ``llmserve bisect --builds B0 ... Bn`` (filled in below)."""

from __future__ import annotations

from typing import Any


def add_compare_parser(bsub: Any) -> None:
    pass


def add_parser(sub: Any) -> None:
    pass

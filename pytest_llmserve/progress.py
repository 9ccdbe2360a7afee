"""Where the package says what it is doing: its loggers (``pytest_llmserve`` and below it, e.g. the gates'
``pytest_llmserve.gates``) at INFO, and :func:`shown_by`, which hands those lines to a handler for a while (the
terminal under pytest, stderr under the ``llmserve`` command). Standard library only."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: The package's logger, parent of every module's.
PACKAGE_LOGGER = "pytest_llmserve"


@contextlib.contextmanager
def shown_by(handler: logging.Handler) -> Iterator[None]:
    """The package's progress lines (INFO and above) to ``handler`` while the block runs; they still reach the root
    logger too (pytest's live log and captured log)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    level = package.level
    package.addHandler(handler)
    if package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


__all__ = ["PACKAGE_LOGGER", "shown_by"]

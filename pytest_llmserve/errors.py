"""Exceptions raised by the core. The plugin turns them into pytest usage errors or failures."""

from __future__ import annotations


class LLMServeError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(LLMServeError):
    """A configuration value is wrong. The message names the key, the value and where it came from."""


class ServerError(LLMServeError):
    """The server could not be started, became unusable, or died."""


class ServerStartError(ServerError):
    """The server exited during boot or missed its startup deadline."""


class ServerDiedError(ServerError):
    """The server process exited while tests still needed it."""


class PreflightError(ServerError):
    """Something on the machine blocks a boot (port taken, stale server, too few GPUs)."""


class RequestError(LLMServeError):
    """A request to the server failed (HTTP error, timeout, truncated stream)."""


class BaselineError(LLMServeError):
    """A baseline file is unreadable, of another schema, or cannot be compared."""


class ReferenceAnswersError(LLMServeError):
    """A recorded reference's answers cannot be used: unreadable, of another model or prompts, or the file
    to record them to exists already (it is never overwritten)."""

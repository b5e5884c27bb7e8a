"""Exceptions raised by surgery.

Every message is one line that says what was given, what is valid and how to fix it; the CLI
prints it as is and exits with status 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class SurgeryError(Exception):
    """Base class for every error that surgery raises on bad input."""


class UnsupportedModelError(SurgeryError):
    """The model's family has no anatomy adapter."""


class StrategyNotFoundError(SurgeryError):
    """No strategy with the given registry name is installed."""


class ConfigError(SurgeryError):
    """A strategy config or a plan is invalid."""


@contextmanager
def as_field_error(prefix: str = "") -> Iterator[None]:
    """Inside a pydantic validator: a shared check's :class:`ConfigError` raised as the ``ValueError`` pydantic
    reports under the field's name (``prefix``, where the message names the field itself, taken off).

    Every config (``ExportConfig``, ``CompressConfig``) validates a field with the same check the CLI runs,
    through this one conversion.

    Example:
        >>> def check_positive(value: int) -> int:
        ...     if value <= 0:
        ...         raise ConfigError(f"batch must be positive, got {value}")
        ...     return value
        >>> with as_field_error("batch "):
        ...     check_positive(-1)
        Traceback (most recent call last):
        ...
        ValueError: must be positive, got -1
    """
    try:
        yield
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix(prefix)) from None


class PlanError(SurgeryError):
    """A plan does not fit the model it is applied to."""


class ModelLoadError(SurgeryError):
    """A saved model directory is missing, unreadable or inconsistent with its manifest."""


class DataError(SurgeryError):
    """Input data is missing, unreadable or lacks a needed column."""


class OutputPathError(SurgeryError):
    """The output directory would overwrite something the user owns."""


class StockFormatError(SurgeryError):
    """A surgered structure that a stock Hugging Face config cannot express (``save_stock``, ``--stock``)."""


class MissingDependencyError(SurgeryError):
    """An optional package that a feature needs is not installed (ONNX Runtime, OpenVINO ...)."""

"""Exceptions raised by surgery.

Every message is one line that says what was given, what is valid and how to fix it; the CLI
prints it as is and exits with status 2.
"""

from __future__ import annotations


class SurgeryError(Exception):
    """Base class for every error that surgery raises on bad input."""


class UnsupportedModelError(SurgeryError):
    """The model's family has no anatomy adapter."""


class StrategyNotFoundError(SurgeryError):
    """No strategy with the given registry name is installed."""


class ConfigError(SurgeryError):
    """A strategy config or a plan is invalid."""


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

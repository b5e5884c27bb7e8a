"""surgery: model surgery for Hugging Face encoders.

Example:
    >>> from transformers import BertConfig, BertModel
    >>> import surgery
    >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
    ...                  num_attention_heads=4, intermediate_size=37)
    >>> model = BertModel(cfg)
    >>> report = surgery.convert(model, surgery.strategies.HeadPruningStrategy(heads={0: [0]}))
    >>> report.params_after.total < report.params_before.total
    True
"""

from __future__ import annotations

from surgery.anatomy import adapter_for
from surgery.api import apply_plan, convert, count_params, inspect, plan
from surgery.errors import (
    ConfigError,
    DataError,
    ModelLoadError,
    OutputPathError,
    PlanError,
    StrategyNotFoundError,
    SurgeryError,
    UnsupportedModelError,
)
from surgery.io import from_pretrained, save_pretrained
from surgery.registry import get_strategy, register_adapter, register_strategy
from surgery.report import LayerChange, ModelAnatomy, ParamCount, SurgeryReport
from surgery.strategy import Plan, Strategy, StrategyConfig

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "LayerChange",
    "ModelAnatomy",
    "ModelLoadError",
    "OutputPathError",
    "ParamCount",
    "Plan",
    "PlanError",
    "Strategy",
    "StrategyConfig",
    "StrategyNotFoundError",
    "SurgeryError",
    "SurgeryReport",
    "UnsupportedModelError",
    "adapter_for",
    "apply_plan",
    "convert",
    "count_params",
    "from_pretrained",
    "get_strategy",
    "inspect",
    "plan",
    "register_adapter",
    "register_strategy",
    "save_pretrained",
]


def __getattr__(name: str):  # lazy, so `import surgery` does not import every built-in strategy
    if name == "strategies":
        import surgery.strategies as module

        return module
    if name == "to_sentence_transformer":  # lazy too: sentence-transformers is an optional extra
        from surgery.embedding.interop import to_sentence_transformer

        return to_sentence_transformer
    raise AttributeError(name)

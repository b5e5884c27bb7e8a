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

from typing import TYPE_CHECKING

from surgery.core.errors import (
    ConfigError,
    DataError,
    ModelLoadError,
    OutputPathError,
    PlanError,
    StrategyNotFoundError,
    SurgeryError,
    UnsupportedModelError,
)
from surgery.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from surgery.anatomy import adapter_for
    from surgery.core.registry import get_method, register_adapter, register_method
    from surgery.core.report import LayerChange, ModelAnatomy, ParamCount, SurgeryReport
    from surgery.core.run import RunContext, count_params
    from surgery.core.strategy import Method, Plan, Strategy, StrategyConfig
    from surgery.orchestration.api import apply_plan, convert, inspect, plan, preview
    from surgery.orchestration.pipeline import Pipeline, PipelineSession
    from surgery.persist.model_io import from_pretrained, save_pretrained
    from surgery.runtimes.export_config import ExportConfig, export

# Imported on first use, so that `import surgery` (and with it `surgery --help` and every input
# error of the command line) does not pay for torch and transformers.
_LAZY = {
    "adapter_for": "surgery.anatomy", "apply_plan": "surgery.orchestration.api", "convert": "surgery.orchestration.api",
    "count_params": "surgery.core.run", "inspect": "surgery.orchestration.api", "plan": "surgery.orchestration.api",
    "preview": "surgery.orchestration.api", "Pipeline": "surgery.orchestration.pipeline",
    "PipelineSession": "surgery.orchestration.pipeline",
    "RunContext": "surgery.core.run", "Method": "surgery.core.strategy",
    "from_pretrained": "surgery.persist.model_io", "save_pretrained": "surgery.persist.model_io",
    "get_method": "surgery.core.registry",
    "register_adapter": "surgery.core.registry", "register_method": "surgery.core.registry",
    "LayerChange": "surgery.core.report", "ModelAnatomy": "surgery.core.report", "ParamCount": "surgery.core.report",
    "SurgeryReport": "surgery.core.report", "Plan": "surgery.core.strategy", "Strategy": "surgery.core.strategy",
    "StrategyConfig": "surgery.core.strategy", "strategies": "surgery.strategies",
    # the package is callable: surgery.compress(model, data, target=...) (surgery/compress/__init__.py)
    "compress": "surgery.compress", "SpeedupTarget": "surgery.compress.compress_report",
    "DropTarget": "surgery.compress.compress_report",
    # needs the optional onnx extra only when called
    "export_onnx": "surgery.runtimes.onnx",
    # surgery.export(model, out_dir, ExportConfig(runtime=...)): any runtime's artefact (surgery.runtimes)
    "export": "surgery.runtimes.export_config", "ExportConfig": "surgery.runtimes.export_config",
    # needs the optional embeddings extra (sentence-transformers) only when called
    "to_sentence_transformer": "surgery.runtimes.sentence_interop",
}

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "ExportConfig",
    "LayerChange",
    "Method",
    "ModelAnatomy",
    "ModelLoadError",
    "OutputPathError",
    "ParamCount",
    "Pipeline",
    "PipelineSession",
    "Plan",
    "PlanError",
    "RunContext",
    "Strategy",
    "StrategyConfig",
    "StrategyNotFoundError",
    "SurgeryError",
    "SurgeryReport",
    "UnsupportedModelError",
    "adapter_for",
    "apply_plan",
    "compress",
    "convert",
    "count_params",
    "export",
    "from_pretrained",
    "get_method",
    "inspect",
    "plan",
    "preview",
    "register_adapter",
    "register_method",
    "save_pretrained",
]


__getattr__, __dir__ = lazy_exports("surgery", globals(), _LAZY, modules=("strategies", "compress"))

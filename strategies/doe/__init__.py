"""DoE (Decomposition of Experts): prompt tuning, attribution, a binary search of the rate, reversible experts.

* :mod:`.soft_prompt`: ``soft-prompt``, the trainable prompt tokens; :mod:`.prompt_tuning`: training them;
* :mod:`.zero_recovery_prune`: ``zero-recovery-prune``, the attribution-ranked cut (FFN neurons physically,
  attention rows zero-recovered), which shares its neuron scorer with ``ffn-prune``;
* :mod:`.unplug`: per-task experts plugged in and out of one shared model (the removal engine's undo);
* :mod:`.doe`: the ``doe`` pipeline, :func:`run_doe` and the multi-task :func:`build_runtime`;
* :mod:`.rate_search`: Algorithm 1, the binary search of the pruning rate;

``surgery experts`` (per-task experts from the command line) is :mod:`surgery.cli.experts`, a CLI plugin
registered through the ``surgery.commands`` entry point.

The names below are imported on first use, so that ``surgery experts --help`` does not pay for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from surgery.strategies.doe.doe import (
        DoEConfig,
        DoEPipeline,
        DoEResult,
        build_runtime,
        check_tasks,
        run_doe,
        runtime_config,
    )
    from surgery.strategies.doe.soft_prompt import SoftPromptConfig, SoftPromptStrategy
    from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
    from surgery.strategies.doe.zero_recovery_prune import (
        ZeroRecoveryPruningConfig,
        ZeroRecoveryPruningStrategy,
    )

_LAZY = {
    "DoEConfig": "surgery.strategies.doe.doe",
    "DoEResult": "surgery.strategies.doe.doe",
    "DoEPipeline": "surgery.strategies.doe.doe",
    "ZeroRecoveryPruningConfig": "surgery.strategies.doe.zero_recovery_prune",
    "ZeroRecoveryPruningStrategy": "surgery.strategies.doe.zero_recovery_prune",
    "SoftPromptConfig": "surgery.strategies.doe.soft_prompt",
    "SoftPromptStrategy": "surgery.strategies.doe.soft_prompt",
    "TaskExpert": "surgery.strategies.doe.unplug",
    "UnplugRuntime": "surgery.strategies.doe.unplug",
    "build_runtime": "surgery.strategies.doe.doe",
    "check_tasks": "surgery.strategies.doe.doe",
    "run_doe": "surgery.strategies.doe.doe",
    "runtime_config": "surgery.strategies.doe.doe",
}

__all__ = [
    "DoEConfig",
    "DoEPipeline",
    "DoEResult",
    "SoftPromptConfig",
    "SoftPromptStrategy",
    "TaskExpert",
    "UnplugRuntime",
    "ZeroRecoveryPruningConfig",
    "ZeroRecoveryPruningStrategy",
    "build_runtime",
    "check_tasks",
    "run_doe",
    "runtime_config",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

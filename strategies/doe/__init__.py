"""DoE (Decomposition of Experts): prompt tuning, attribution, a binary search of the rate, reversible experts.

* :mod:`.soft_prompt`: ``soft-prompt``, the trainable prompt tokens; :mod:`.prompt_tuning`: training them;
* :mod:`.zero_recovery`: ``zero-recovery-prune``, the attribution-ranked cut (FFN neurons physically,
  attention rows zero-recovered), which shares its neuron scorer with ``ffn-prune``;
* :mod:`.unplug`: per-task experts plugged in and out of one shared model (the removal engine's undo);
* :mod:`.pipeline`: the ``doe`` pipeline, :func:`run_doe` and the multi-task :func:`build_runtime`.
"""

from surgery.strategies.doe.pipeline import (
    DoEConfig,
    DoEResult,
    DoEStrategy,
    build_runtime,
    check_tasks,
    run_doe,
    runtime_config,
)
from surgery.strategies.doe.soft_prompt import SoftPromptConfig, SoftPromptStrategy
from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
from surgery.strategies.doe.zero_recovery import (
    ModulePruningConfig,
    ModulePruningStrategy,
    ZeroRecoveryPruningConfig,
    ZeroRecoveryPruningStrategy,
)

__all__ = ["DoEConfig", "DoEResult", "DoEStrategy", "ModulePruningConfig", "ModulePruningStrategy",
           "SoftPromptConfig", "SoftPromptStrategy", "TaskExpert", "UnplugRuntime", "ZeroRecoveryPruningConfig",
           "ZeroRecoveryPruningStrategy", "build_runtime", "check_tasks", "run_doe", "runtime_config"]

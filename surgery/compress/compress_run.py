"""``surgery.compress``: a model N times faster on this machine's runtime, at the smallest loss, in one call.

Phases, each reported as progress and timed in the report:

1. the batch shape (the user's, or read off the data) and the calibration batches;
2. the latency table of the original on the target runtime (measured on this machine), and, when
   the target runtime is not the reference one, the original's own speedup there;
3. what every head, neuron group and layer carries (:mod:`surgery.compress.mask_fisher`);
4. the search (:mod:`surgery.compress.removal_path`): one path of removals, every speed point on it,
   and the same search over heads and neurons only (Kwon et al.'s space) and with every layer cut
   alike (the uniform cuts this project measured);
5. candidates, each cut, refitted, written as the runtime's artefact (ONNX graph, OpenVINO IR, bf16
   weights; int8 calibrated on the user's batches), loaded, and judged and timed on that artefact against
   the original: path points around the target (``--speedup``) or found by bisection along the
   paths (``--max-drop``), the points of the units-only and the uniform paths, the unchanged model
   on the runtime (smoothed int8 alone, for ``onnxruntime-int8``) and a uniform layer-drop at the
   same predicted speed; each timed side by side;
6. the pick, then the recovery tiers on the winner in the time the budget leaves (each estimated from
   timed steps and announced first: :mod:`surgery.compress.training_tier`); the
   winner's artefact (the judged files) is handed back in the result, never exported again.

``--runtime auto`` (:mod:`surgery.compress.auto_runtime`) runs this on every runtime available here
that can reach the target and keeps the best.

Phases 1-4 live in :mod:`surgery.compress.plan`, 5-6 in :mod:`surgery.compress.candidate_run`.

The budget (minutes) covers the whole job: a candidate whose expected cost no longer fits is
skipped and said so, and training gets only the time that is left.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from surgery.compress.compress_report import CompressResult
from surgery.compress.config import CompressConfig
from surgery.compress.latency_source import LatencySource
from surgery.compress.plan import Clock
from surgery.compress.runtime_search import compress_on
from surgery.core.errors import ConfigError
from surgery.core.progress import ProgressCallback
from surgery.persist.config_values import check_data_argument, check_model_argument


def compress(model: nn.Module, data: Any, config: CompressConfig | None = None, *, eval_data: Any = None,
             latency: LatencySource | None = None, progress: ProgressCallback | None = None,
             clock: Clock | None = None, **settings: Any) -> CompressResult:
    """Make ``model`` reach the target of ``config`` on its runtime at the smallest loss; judged against the original.

    Args:
        model: the original (a task model with ``data`` labelled, or an encoder with unlabelled texts);
            it is not changed.
        data: :class:`surgery.data.task_data.TaskData` (task objective) or :class:`surgery.embedding.TextData`
            (embedding objective); its training split calibrates, its eval split judges.
        config: the settings (:class:`~surgery.compress.config.CompressConfig`): the target (``speedup``,
            ``max_drop``), the ``runtime`` (any registered name, or ``auto``), the budget, the batch shape.
        eval_data: held-out data to judge on instead of ``data``'s eval split.
        latency: where times come from (default: measured on this machine).
        progress: called with progress events.
        clock: the job's deadline (default: ``config.budget_minutes`` from now). ``surgery compress`` counts the
            budget from the command's start and keeps back its save (:class:`~surgery.compress.plan.Clock`).
        **settings: the config's fields as keywords instead of ``config`` (``target=SpeedupTarget(...)``
            stands for ``speedup`` and ``max_drop``).

    Returns:
        One :class:`CompressResult`: the chosen model, the report (its ``config`` the settings by the
        same names), the candidates, and the winner's runtime artefact (``artefact``), the very files
        it was judged and timed on.

    Example:
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> model, report, candidates = compress(model, tiny_task_data(), CompressConfig(max_drop=2.0),
        ...                                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> report.winner_result().drop <= 2.0, report.reference, report.config["runtime"]
        (True, 'the original model in torch (fp32), unchanged', 'torch')
    """
    check_model_argument(model, "compress")  # a name or path is refused in one line, saying how to load it
    check_data_argument(data, "compress")
    check_data_argument(eval_data, "compress", "eval_data")
    if config is None:
        config = CompressConfig.build(**settings)
    elif not isinstance(config, CompressConfig):
        raise ConfigError(f"compress: config must be a CompressConfig, got {type(config).__name__}")
    elif settings:
        raise ConfigError(f"compress: pass settings in the CompressConfig or as keywords, not both (got "
                          f"{', '.join(sorted(settings))})")
    if config.auto:
        from surgery.compress.auto_runtime import compress_auto

        return compress_auto(model, data, config, eval_data=eval_data, latency=latency, progress=progress,
                             clock=clock)
    from surgery.compress.latency_measure import resolve_runtime

    # Resolved once, here: every phase below is handed these objects, never the names again.
    runtime = resolve_runtime(config.runtime, "compress")
    against = resolve_runtime(config.against_runtime, "compress: against_runtime")
    result, _ = compress_on(model, data, config, runtime=runtime, against=against, eval_data=eval_data,
                            latency=latency, progress=progress, clock=clock or Clock(config.budget_minutes))
    return result

"""A candidate of compression: a cut of the original, recovered, run on the target runtime, judged against the original.

A cut (:class:`~surgery.compress.removal_path.Removal`) becomes a model through registered strategies
only, heads and neurons first and whole layers last, so ``surgery.json`` records plans that
``surgery.from_pretrained`` replays. The no-training tier then re-solves the output projections
whose inputs were cut by least squares against the original
(:func:`surgery.training.refit.refit_projections`), layers mapped through any dropped ones. On any
runtime but ``torch`` the candidate's artefact is written by the runtime as ``surgery export
--runtime`` writes it (int8 runtimes calibrated on the user's training batches) and loaded, and it
is judged on that artefact: dev accuracy for the task objective, mean cosine and recall@10 of its sentence embeddings
for the embedding objective, always against the original in PyTorch fp32.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.compress.held_out import Judged, paired_drop
from surgery.compress.removal_path import Removal
from surgery.compress.structure import Structure
from surgery.training.refit import RefitResult, TeacherOutputs, refit_projections
from surgery.training.task_accuracy import accuracy, example_correct

if TYPE_CHECKING:
    from surgery.runtimes import Runtime

#: Examples int8 calibration reads: NNCF's own ``subset_size`` default (``nncf.quantize``), which its
#: authors size for the statistics the quantizer needs; more only costs time per candidate.
INT8_CALIBRATION_EXAMPLES = 300
#: Token positions int8 calibration reads at most: INT8_CALIBRATION_EXAMPLES at 128 tokens. Activation ranges and
#: SmoothQuant's scales are statistics over token positions, so longer texts reach them with fewer examples; at 512
#: tokens 75 texts hold what 300 hold at 128, at a quarter of the statistics passes NNCF runs for every candidate
#: (the unchanged model's export at 512 tokens on BERT-base widths: minutes). Up to 128 tokens nothing changes.
INT8_CALIBRATION_TOKENS = INT8_CALIBRATION_EXAMPLES * 128
#: Bytes of the original's layer outputs a run keeps for the refits of its cuts (per process: each worker keeps its own,
#: :class:`surgery.training.refit.TeacherOutputs`). MiniLM-L6 at 8 batches of 32 x 52 tokens holds at most 491 MB; at
#: BERT-base widths and 128 tokens the first layers are kept and the rest computed for each refit, as without it.
REFIT_TEACHER_BYTES = 512 * 2**20

#: ``path``: the search with whole layers; ``units-path``: heads and neurons only; ``uniform-path``: every
#: layer cut alike; ``unchanged``: the original on the runtime; ``uniform-layer-drop``: every-other
#: layers at the same predicted speed; ``precision``: a path point with op groups in float; ``filled``: a path
#: point with the time it has beyond ``--speedup`` given back as units.
Origin = Literal["path", "units-path", "uniform-path", "unchanged", "uniform-layer-drop", "precision", "filled"]
Tier = Literal["none", "refit", "blockwise", "distil"]


class CandidateResult(BaseModel):
    """One candidate tried: what was cut, how it was recovered, how fast and how faithful it is."""

    name: str
    origin: Origin
    runtime: str
    path_step: int | None = None
    structure: list[dict[str, int] | None]
    removal: Removal
    predicted_speedup: float
    measured_speedup: float | None = None
    speedup_interval: list[float] | None = None
    estimated_loss: float | None = Field(default=None, description="the search's estimate of the objective increase")
    tier: Tier = "refit"
    accuracy: float | None = Field(default=None, description="dev accuracy (task objective), a fraction")
    mean_cosine: float | None = Field(default=None, description="embedding objective: against the original")
    recall_at_10: float | None = None
    drop: float = Field(description="points lost against the original on the examples the search read: accuracy, "
                        "or 100 x (1 - mean cosine)")
    search: Judged | None = Field(default=None, description="the figures the search decided on, on the search's "
                                  "examples (the screen only, when it was no contender), with the drop's interval")
    held_out: Judged | None = Field(default=None, description="the figures on the held-out pick examples (finalists "
                                    "only): what the pick and --max-drop read")
    timed_because: str | None = Field(default=None, description="why it was timed, or why not")
    seconds: float = 0.0
    steps: dict[str, float] = Field(default_factory=dict, description="seconds of its build's steps: cut (the cut, "
                                    "its refit and the calibration objective), artefact (written and loaded), "
                                    "scores (the first judging)")
    worker: bool = Field(default=False, description="built in a worker process, beside others")
    artefact: dict[str, str] = Field(default_factory=dict, description="SHA-256 of each file of the runtime "
                                     "artefact it was judged and timed on (empty for torch)")
    int8_float: list[str] = Field(default_factory=list, description="op groups its int8 artefact left in float "
                                  "(the precision map; empty: all int8)")
    int8_refit: bool = Field(default=False, description="its cut refitted against the inputs its int8 artefact "
                             "feeds it (the quantization-aware refit), not the original's")
    notes: list[str] = Field(default_factory=list)


def apply_removal(model: nn.Module, removal: Removal) -> None:
    """Cut ``model`` in place through registered strategies: heads, then FFN neurons, then whole layers.

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=3))
        >>> apply_removal(model, Removal(heads={0: [1]}, neurons={2: [0, 1]}, layers=[1]))
        >>> [(l.heads, l.ffn_width) for l in surgery.inspect(model).layers]
        [(3, 37), (4, 35)]
        >>> [s["strategy"] for s in surgery.core.manifest.steps_of(model)]
        ['head-prune', 'ffn-prune', 'layer-drop']
    """
    from surgery.orchestration.api import convert
    from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy, LayerDropStrategy

    cut = removal.effective()
    if cut.heads:
        convert(model, HeadPruningStrategy(heads=cut.heads))
    if cut.neurons:
        convert(model, FFNPruningStrategy(neurons=cut.neurons))
    if cut.layers:  # last: the unit plans above name layers of the model before any is dropped
        convert(model, LayerDropStrategy(layers=cut.layers))


def file_digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory`` by relative path (proof that a saved artefact is the judged one).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("x")
        >>> file_digests(d)["a.txt"][:12]
        '2d711642b726'
    """
    return {path.relative_to(directory).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


@dataclass
class Served:
    """A candidate as it runs: the loaded artefact, its directory (None for ``torch``) and its files' digests."""

    model: nn.Module
    directory: Path | None
    digests: dict[str, str]


def served_on(runtime: Runtime, model: nn.Module, out: Path, *, objective: str,
              calibration: Sequence[Mapping[str, torch.Tensor]], threads: int | None) -> Served:
    """``model`` as it runs on ``runtime``: itself where the runtime runs it as is, else its artefact written into
    ``out`` (int8 calibrated on the first :data:`INT8_CALIBRATION_EXAMPLES` of ``calibration``, the user's
    batches) and loaded from there, with its files' digests.

    Example:
        >>> from surgery.runtimes import get_runtime
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> served_on(get_runtime("torch"), model, Path("unused"), objective="task", calibration=[],
        ...           threads=1).model is model
        True
    """
    if runtime.as_is:
        return Served(model, None, {})
    batches = int8_calibration(calibration) if runtime.needs_calibration else None
    artefact = runtime.write_artefact(model, out, task="base" if objective == "embedding" else "auto",
                                      calibration=batches, threads=threads)
    loaded = runtime.load(artefact.directory, config=model.config, threads=threads)
    return Served(loaded, artefact.directory, file_digests(artefact.directory))


@dataclass
class Unchanged:
    """The unchanged model on one runtime, written once per run and runtime (:func:`unchanged_on`).

    The up-front estimate times its export and a forward of it, the latency table times it as its
    ``model`` probe, the unchanged speedup is measured on it once (``speedup``: the paired value and its
    interval), and the ``unchanged`` candidate is judged on it: the same files throughout, never
    exported again. Its directory lives in a temporary one of its own, removed when this is dropped
    (unless the files were moved away as the winner's artefact).
    """

    runtime: str
    served: Served
    seconds: float
    speedup: tuple[float, list[float] | None] | None = None
    holder: Any = None  # the TemporaryDirectory that holds the artefact (None where nothing is written)


def unchanged_on(runtime: Runtime, model: nn.Module, *, objective: str,
                 calibration: Sequence[Mapping[str, torch.Tensor]], threads: int | None) -> Unchanged:
    """The unchanged ``model`` written and loaded on ``runtime`` once (:func:`served_on`), as a candidate's is.

    Example:
        >>> from surgery.runtimes import get_runtime
        >>> from surgery.testing import TinySpec, tiny_model
        >>> found = unchanged_on(get_runtime("torch"), tiny_model(TinySpec("bert")), objective="task",
        ...                      calibration=[], threads=1)
        >>> found.served.directory is None, found.runtime
        (True, 'torch')
    """
    import tempfile

    holder = None if runtime.as_is else tempfile.TemporaryDirectory(prefix="surgery-unchanged-")
    started = time.perf_counter()
    served = served_on(runtime, model, Path(holder.name) / "artefact" if holder is not None else Path("unused"),
                       objective=objective, calibration=calibration, threads=threads)
    return Unchanged(runtime.name, served, time.perf_counter() - started, holder=holder)


@dataclass
class PartScores:
    """One model's per-example scores on one part of the dev data (plain data: it crosses processes).

    ``values``: 1 or 0 per example (labelled right, task) or the cosine to the original's embedding
    (embedding); ``recall``: recall@10 of the part's nearest neighbours (embedding only).
    """

    values: list[float]
    recall: float | None = None


def joined(parts: Sequence[PartScores]) -> PartScores:
    """Several parts' scores as one (recall: weighted by each part's examples).

    Example:
        >>> joined([PartScores([1.0, 0.0], 1.0), PartScores([1.0], 0.7)]).values
        [1.0, 0.0, 1.0]
    """
    values = [v for p in parts for v in p.values]
    recalls = [(p.recall, len(p.values)) for p in parts if p.recall is not None]
    recall = sum(r * n for r, n in recalls) / sum(n for _, n in recalls) if recalls else None
    return PartScores(values, recall)


def leading_batches(batches: Sequence[Mapping[str, torch.Tensor]], *, examples: int, tokens: int,
                    padded: bool) -> list[Mapping[str, torch.Tensor]]:
    """The first batches of ``batches`` until they hold ``examples`` examples or ``tokens`` token positions (padded
    ones counted where ``padded``, else the attention masks' ones), at least one batch; all if they hold fewer.

    Example:
        >>> def batches(length): return [{"input_ids": torch.zeros(32, length)}] * 16
        >>> [len(leading_batches(batches(n), examples=256, tokens=256 * 128, padded=True)) for n in (64, 512)]
        [8, 2]
    """
    kept: list[Mapping[str, torch.Tensor]] = []
    seen = positions = 0
    for batch in batches:
        if kept and (seen >= examples or positions >= tokens):
            break
        kept.append(batch)
        seen += int(batch["input_ids"].shape[0])
        mask = None if padded else batch.get("attention_mask")
        positions += int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
    return kept


def int8_calibration(batches: Sequence[Mapping[str, torch.Tensor]], examples: int = INT8_CALIBRATION_EXAMPLES,
                     tokens: int = INT8_CALIBRATION_TOKENS) -> list[Mapping[str, torch.Tensor]]:
    """The first batches of ``batches`` that hold at least ``examples`` examples or ``tokens`` token positions (their
    attention masks' ones: calibration reads each text unpadded), at least one batch; all if they hold fewer.

    Example:
        >>> def batches(length): return [{"input_ids": torch.zeros(32, length)}] * 16
        >>> [len(int8_calibration(batches(n))) for n in (4, 128, 256, 512)]
        [10, 10, 5, 3]
    """
    return leading_batches(batches, examples=examples, tokens=tokens, padded=False)


@dataclass
class Judge:
    """Everything a candidate is built and judged with: the original, the data, the runtime.

    ``dev`` is the labelled dev batches (task objective), ``texts`` the held-out texts (embedding);
    ``calibration`` the training batches the refit reads, ``smoothing`` those int8 calibration reads
    (the first :data:`INT8_CALIBRATION_EXAMPLES` of them). ``parts`` splits the dev data
    (:mod:`surgery.compress.held_out`): part name -> its batches (task) or texts (embedding).
    """

    original: nn.Module
    objective: Literal["task", "embedding"]
    #: the runtime, resolved (a registered name is resolved once, here: a worker rebuilding the judge from files)
    runtime: Runtime
    calibration: list[Mapping[str, torch.Tensor]]
    workdir: Path
    smoothing: list[Mapping[str, torch.Tensor]] = field(default_factory=list)
    dev: list[Mapping[str, torch.Tensor]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tokenizer: Any = None
    sentence: Any = None
    max_length: int | None = None
    threads: int | None = None
    parts: dict[str, list[Any]] = field(default_factory=dict)
    #: the unchanged model as served, written once per run (:class:`Unchanged`): the unchanged candidate is judged
    #: on these files, not on a fresh export
    unchanged: Served | None = None
    _teacher_cache: Any = None
    _refit_teacher: TeacherOutputs | None = None
    _calibration_reference: list[torch.Tensor] | None = None
    _reference: dict[str, float] | None = None
    _reference_parts: dict[str, PartScores] = field(default_factory=dict)
    _exports: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.runtime, str):
            from surgery.runtimes import get_runtime

            self.runtime = get_runtime(self.runtime)

    def reference(self) -> dict[str, float]:
        """The original's own figures (PyTorch fp32): dev accuracy, or fidelity 1 against itself.

        Where the parts hold every dev example once, the accuracy is read from the per-example scores
        :meth:`prepare_reference` computes anyway: one pass of the original over dev, not two (at 512
        tokens on BERT-base widths a pass is 18 s a batch).
        """
        if self._reference is None:
            if self.objective == "task":
                self.prepare_reference()
                scores = [self._reference_parts[p] for p in self.parts]
                examples = sum(len(s.values) for s in scores)
                if scores and examples == sum(int(b["labels"].shape[0]) for b in self.dev if "labels" in b):
                    self._reference = {"accuracy": sum(sum(s.values) for s in scores) / examples}
                else:
                    self._reference = {"accuracy": accuracy(self.original, self.dev)}
            else:
                self._reference = {"mean_cosine": 1.0, "recall_at_10": 1.0}
        return self._reference

    def prepare_reference(self) -> float:
        """The original's figures on every dev part, computed once before any candidate is judged: its
        per-example scores (task) or its embeddings of every text (embedding). Returns the seconds it
        took (0 once done). Candidates are then judged at their own cost alone, and worker processes read
        the embeddings from the shared files (:func:`surgery.compress.candidate_pool.write_shared`) rather
        than each computing them again.

        Example:
            >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
            >>> first, second = list(tiny_task_data(8).loader(batch_size=4))
            >>> judge = Judge(original=tiny_model(TinySpec("bert", task="seq-cls")), objective="task",
            ...               runtime="torch", calibration=[], workdir=Path("."), dev=[first, second],
            ...               parts={"screen": [first], "pick": [second]})
            >>> judge.prepare_reference() > 0, judge.prepare_reference(), sorted(judge._reference_parts)
            (True, 0.0, ['pick', 'screen'])
            >>> from surgery.training.task_accuracy import accuracy
            >>> judge.reference()["accuracy"] == accuracy(judge.original, [first, second])
            True
        """
        since = time.perf_counter()
        missing = [part for part in self.parts if part not in self._reference_parts]
        if self.objective == "task":
            for part in missing:
                self.reference_scores(part)
        elif missing:
            self.teacher_cache().embed([t for part in missing for t in self.parts[part]])
            for part in missing:
                self.reference_scores(part)
        return time.perf_counter() - since if missing else 0.0

    def build(self, removal: Removal, *, refit: bool = True) -> tuple[nn.Module, RefitResult | None, list[str]]:
        """A copy of the original with ``removal`` cut, refitted against the original (the no-training tier).

        The refit is kept only when it lowers the objective on the calibration batches (task loss, or
        squared distance to the original's embeddings): on MiniLM-L6 embeddings it sometimes lowered
        recall@10 while it matched each projection better. Returns the model, the kept refit and notes.
        """
        model = copy.deepcopy(self.original)
        apply_removal(model, removal)
        if not refit or removal.units() == 0:
            return model, None, []
        before = self.calibration_objective(model)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        result = refit_projections(model, self.original, self.calibration, teacher_outputs=self.refit_teacher())
        after = self.calibration_objective(model)
        if after <= before:
            return model, result, [f"refit kept: calibration objective {before:.4g} -> {after:.4g}"]
        model.load_state_dict(state)
        return model, None, [f"refit undone: it raised the calibration objective {before:.4g} -> {after:.4g}"]

    def refit_teacher(self) -> TeacherOutputs:
        """The original's layer outputs on the calibration batches, kept across this judge's refits (up to
        :data:`REFIT_TEACHER_BYTES`): every cut is refitted against the same ones."""
        if self._refit_teacher is None or not self._refit_teacher.serves(self.original, self.calibration):
            self._refit_teacher = TeacherOutputs(self.original, self.calibration, max_bytes=REFIT_TEACHER_BYTES)
        return self._refit_teacher

    def calibration_objective(self, model: nn.Module) -> float:
        """The objective on the calibration batches: mean task loss, or mean ``‖e − e_original‖²``."""
        from surgery.compress.mask_fisher import objective_value

        pooled = None
        if self.objective == "embedding":
            from surgery.embedding.evaluate import embed_batch
            from surgery.embedding.pooling import SentenceConfig

            config = self.sentence or SentenceConfig()

            def pooled(m: nn.Module, batch: Any) -> torch.Tensor:
                return embed_batch(m, batch, config)[0]

            if self._calibration_reference is None:
                _, self._calibration_reference = objective_value(self.original, self.calibration, "embedding",
                                                                 pooled, None)
        value, _ = objective_value(model, self.calibration, self.objective, pooled, self._calibration_reference)
        return value

    def serve(self, model: nn.Module, out: Path | None = None) -> Served:
        """``model`` as it will run: itself where the runtime runs it as is (``torch``), else the runtime's artefact
        written and loaded.

        The artefact (ONNX graph, OpenVINO IR, bf16 weights ...) is written by the runtime
        (:meth:`surgery.runtimes.Runtime.write_artefact`, int8 ones calibrated on the first
        :data:`INT8_CALIBRATION_EXAMPLES` of ``smoothing``, the user's training batches) into ``out``
        (default: its own directory under ``workdir``) and loaded from there, so the candidate is
        judged and timed on exactly the files a user would deploy; their SHA-256 digests are kept,
        and the winner's directory is the one ``compress`` hands back.
        """
        if out is None and not self.runtime.as_is:
            self._exports += 1
            out = self.workdir / f"candidate-{self._exports}"
        return served_on(self.runtime, model, out or self.workdir, objective=self.objective,
                         calibration=self.smoothing or self.calibration, threads=self.threads)

    def load(self, directory: Path, model: nn.Module) -> nn.Module:
        """The runtime artefact in ``directory`` (written for ``model``) loaded to run, on this judge's threads."""
        return self.runtime.load(directory, config=model.config, threads=self.threads)

    def on_runtime(self, model: nn.Module) -> nn.Module:
        """``model`` as it will run (:meth:`serve`), without the artefact's whereabouts."""
        return self.serve(model).model

    def judge(self, model: nn.Module) -> dict[str, float]:
        """Dev figures of ``model`` (already on its runtime) against the original, and the drop in points."""
        if self.objective == "task":
            acc = accuracy(model, self.dev)
            return {"accuracy": acc, "drop": round(100.0 * (self.reference()["accuracy"] - acc), 4)}
        from surgery.embedding.evaluate import evaluate_embeddings

        k = max(1, min(10, len(self.texts) - 1))
        report = evaluate_embeddings(model, self.teacher_cache(), self.tokenizer, self.texts, self.sentence_config(),
                                     k=k, max_length=self.max_length)
        return {"mean_cosine": report.mean_cosine, "recall_at_10": report.recall_at_k,
                "drop": round(100.0 * (1.0 - report.mean_cosine), 4)}

    def sentence_config(self) -> Any:
        from surgery.embedding.pooling import SentenceConfig

        return self.sentence or SentenceConfig()

    def teacher_cache(self) -> Any:
        """The original's embeddings, computed once per text for every candidate judged here."""
        from surgery.embedding.evaluate import TeacherCache

        if self._teacher_cache is None:
            self._teacher_cache = TeacherCache(self.original, self.tokenizer, self.sentence_config(), self.max_length)
        return self._teacher_cache

    def scores(self, model: nn.Module, part: str) -> PartScores:
        """Per-example scores of ``model`` (already on its runtime) on the dev part ``part``."""
        if self.objective == "task":
            return PartScores(example_correct(model, self.parts[part]).float().tolist())
        from surgery.embedding.evaluate import TeacherCache, retrieval_agreement

        texts = self.parts[part]
        student = TeacherCache(model, self.tokenizer, self.sentence_config(), self.max_length).embed(texts)
        teacher = self.teacher_cache().embed(texts)
        cosines = torch.nn.functional.cosine_similarity(student.float(), teacher.float(), dim=1)
        k = min(10, len(texts) - 1)
        return PartScores(cosines.tolist(), retrieval_agreement(student, teacher, k) if k >= 1 else None)

    def reference_scores(self, part: str) -> PartScores:
        """The original's own per-example scores on ``part`` (PyTorch fp32; 1 per text for embeddings)."""
        if part not in self._reference_parts:
            if self.objective == "task":
                self._reference_parts[part] = self.scores(self.original, part)
            else:
                self._reference_parts[part] = PartScores([1.0] * len(self.parts[part]), 1.0)
        return self._reference_parts[part]

    def figures(self, scores: Sequence[PartScores], parts: Sequence[str]) -> tuple[Judged, dict[str, float]]:
        """``scores`` of ``parts`` against the original's on the same examples: the paired drop with its
        interval, and the figures a :class:`CandidateResult` carries."""
        mine, base = joined(scores), joined([self.reference_scores(p) for p in parts])
        judged = paired_drop(base.values, mine.values)
        if self.objective == "task":
            return judged, {"accuracy": judged.value, "drop": judged.drop}
        recall = mine.recall if mine.recall is not None else math.nan
        return judged, {"mean_cosine": judged.value, "recall_at_10": recall, "drop": judged.drop}


def layer_drop_removal(num_layers: int, structure_speedup: Callable[[Removal], float], target: float,
                       removable: Sequence[int]) -> Removal | None:
    """The uniform layer-drop (``every-other`` rule) with the fewest layers gone that reaches ``target``.

    Example:
        >>> layer_drop_removal(6, lambda r: 6 / (6 - len(r.layers)), 2.0, range(6)).layers
        [1, 3, 5]
    """
    from surgery.strategies.pruning.layer_drop import layers_to_drop

    best = None
    for count in range(1, num_layers):
        drop = layers_to_drop(num_layers, count, "every-other")
        if not set(drop) <= set(removable):
            continue
        best = Removal(layers=drop)
        if structure_speedup(best) >= target:
            return best
    return best


def finite(value: float | None) -> float | None:
    """``value`` unless it is NaN or infinite (JSON has neither)."""
    return value if value is not None and math.isfinite(value) else None


def reference_label(against: Runtime) -> str:
    """How a report names what its speedups are against: the original model in that runtime, unchanged.

    Example:
        >>> from surgery.runtimes import get_runtime
        >>> reference_label(get_runtime("torch"))
        'the original model in torch (fp32), unchanged'
    """
    return f"the original model in {against.name} ({against.precision}), unchanged"


def result_of(name: str, origin: Origin, runtime: str, removal: Removal, start: Structure, *, predicted: float,
              figures: Mapping[str, float], started: float, path_step: int | None = None,
              estimated_loss: float | None = None, tier: Tier = "refit", notes: Sequence[str] = ()) -> CandidateResult:
    """A :class:`CandidateResult` from a judged candidate's figures."""
    return CandidateResult(name=name, origin=origin, runtime=runtime, path_step=path_step,
                           structure=removal.structure(start).to_json(), removal=removal.effective(),
                           predicted_speedup=round(predicted, 4), estimated_loss=estimated_loss, tier=tier,
                           accuracy=finite(figures.get("accuracy")), mean_cosine=finite(figures.get("mean_cosine")),
                           recall_at_10=finite(figures.get("recall_at_10")), drop=float(figures["drop"]),
                           seconds=round(time.perf_counter() - started, 3), notes=list(notes))

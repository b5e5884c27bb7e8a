"""Where one candidate of ``compress --max-drop 1 --runtime openvino-int8`` spends its time.

One candidate (a cut found by a real run: ``path-104@2.05x`` of text-source seed 0 in
experiments/deep_cuts/results/deep_cuts.json) is built and judged on the fine-tuned MiniLM-L6 classifier exactly
as a ``compress`` worker does it (:func:`surgery.compress.candidate_pool.build_candidate` with its weights saved,
then :func:`~surgery.compress.candidate_pool.judge_candidate` on the rest of the search part and on the
held-out pick part), with the run's own data: the suite task's train split (the refit's 256 examples, int8
calibration's first 300 of the 512), dev split in screen / rest / pick as
:func:`surgery.compress.runtime_search.dev_parts` splits it. One thread (torch and OpenVINO), as a worker of
``--workers 2`` on this 2-core machine runs.

Timers wrap the steps where they are called (the library is not changed for this): the cut, the refit's
solve and its objective before and after, the torch forward of the parity batch, ``openvino.convert_model``,
``openvino.save_model``, every compile (``OpenVinoModel``, NNCF's engines), the parity check, NNCF's
pipeline (graph builds, each statistics pass, SmoothQuant, MinMax, fast bias correction with its sub-model
compiles), the digests, and the scores per dev part. Times are inclusive (a step inside another counts in
both); ``seconds`` is the whole candidate. ``--profile`` adds a cProfile of one round (its top functions by
cumulative time) to the JSON.

Before/after comparisons run this script once per code tree, interleaved, each in its own process::

    nice -n 19 python experiments/compress_cost/candidate_cost.py --model /tmp/cost/finetuned --label after
    PYTHONPATH=/work/main nice -n 19 python experiments/compress_cost/candidate_cost.py --model /tmp/cost/finetuned \
        --label before

(``PYTHONPATH`` puts that tree's ``surgery`` first; the JSON records which one ran and its commit.)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
import hashlib
import io
import json
import math
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # experiments/ (appended: a PYTHONPATH tree's surgery comes first)
RESULTS = ROOT / "experiments" / "compress_cost" / "results"
DEEP_CUTS = ROOT / "experiments" / "deep_cuts" / "results" / "deep_cuts.json"


class Timers:
    """Wall and CPU seconds and calls per label, from wrappers put on functions where the library calls them.

    CPU seconds (``time.process_time``: every thread of this process, OpenVINO's included) are what a
    loaded machine changes least: a process given a fraction of a core waits, it does not compute more.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.each: dict[str, list[float]] = defaultdict(list)
        self.undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds[label] += spent
                self.cpu[label] += time.process_time() - cpu
                self.calls[label] += 1
                self.each[label].append(round(spent, 4))

        self.undo.append((owner, attr, original))
        setattr(owner, attr, timed)

    @contextlib.contextmanager
    def span(self, label: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[label] += time.perf_counter() - start
            self.cpu[label] += time.process_time() - cpu
            self.calls[label] += 1

    def table(self) -> dict[str, dict[str, Any]]:
        return {k: {"seconds": round(v, 3), "cpu_seconds": round(self.cpu[k], 3), "calls": self.calls[k],
                    **({"each": self.each[k]} if 1 < len(self.each[k]) <= 12 else {})}
                for k, v in self.seconds.items()}


def instrument(timers: Timers) -> None:
    """Timers on the steps of one candidate (see the module docstring); names say where a step sits."""
    import nncf.openvino.engine as ov_engine
    import nncf.quantization.algorithms.pipeline as nncf_pipeline
    import openvino
    from nncf.quantization.algorithms.channel_alignment.algorithm import ChannelAlignment
    from nncf.quantization.algorithms.fast_bias_correction.algorithm import FastBiasCorrection
    from nncf.quantization.algorithms.min_max.algorithm import MinMaxQuantization
    from nncf.quantization.algorithms.smooth_quant.algorithm import SmoothQuant

    import surgery.compress.candidates as candidates
    import surgery.runtimes.openvino.openvino_ir as ir
    from surgery.runtimes.shared.graph_runtime import GraphRuntime

    wraps: list[tuple[Any, str, str]] = [
        (candidates.Judge, "build", "1 build (cut + refit)"),
        (candidates, "apply_removal", "1.1 cut"),
        (candidates, "refit_projections", "1.2 refit: least-squares solve"),
        (candidates.Judge, "calibration_objective", "1.3 refit: objective before/after"),
        (candidates.Judge, "serve", "2 serve (the int8 artefact written and loaded)"),
        (ir, "write_openvino", "2.1 write_openvino"),
        (ir, "reference_batch", "2.1.1 parity batch: torch forward"),
        (ir, "convert_to_ir", "2.1.2 openvino.convert_model"),
        (openvino, "save_model", "2.1.3 openvino.save_model"),
        (ir.OpenVinoModel, "__init__", "2.x compile OpenVinoModel (read + compile)"),
        (ir, "check_parity", "2.1.4 fp32 parity check (infer)"),
        (ir, "calibration_examples", "2.1.5 calibration items"),
        (ir, "quantize", "2.1.6 nncf.quantize"),
        (nncf_pipeline, "build_graph", "2.1.6.a NNCF graph builds"),
        (nncf_pipeline, "collect_statistics", "2.1.6.b NNCF statistics passes (transform, compile, infer)"),
        (ov_engine.OVNativeEngine, "__init__", "2.1.6.c NNCF engine compiles"),
        (ov_engine.OVCompiledModelEngine, "infer", "2.1.6.d NNCF infer calls"),
        (SmoothQuant, "apply", "2.1.6.e SmoothQuant.apply"),
        (ChannelAlignment, "apply", "2.1.6.f ChannelAlignment.apply"),
        (MinMaxQuantization, "apply", "2.1.6.g MinMaxQuantization.apply"),
        (FastBiasCorrection, "apply", "2.1.6.h FastBiasCorrection.apply"),
        (FastBiasCorrection, "_get_bias_shift", "2.1.6.h.1 FBC sub-model compile + infer"),
        (ir, "agreement", "2.1.7 int8 drift (infer)"),
        (ir, "write_model_config", "2.1.8 config.json"),
        (GraphRuntime, "load", "2.2 load the artefact (read record + compile)"),
        (candidates, "file_digests", "2.3 file digests"),
        (candidates.Judge, "scores", "3 scores (all parts)"),
    ]
    for owner, attr, label in wraps:
        timers.wrap(owner, attr, label)


def candidate_removal(name: str, key: str) -> dict[str, Any]:
    """The cut of candidate ``name`` in the deep_cuts run ``key`` (a real run's candidate)."""
    runs = json.loads(DEEP_CUTS.read_text())["runs"]
    return next(c["removal"] for c in runs[key]["candidates"] if c["name"] == name)


def setup(args: argparse.Namespace, workdir: Path) -> Any:
    """The Judge a ``compress`` run on ``args.task`` builds (same data, same parts), on openvino-int8."""
    import torch
    from transformers import AutoTokenizer

    import surgery
    from experiments.tasks import load_suite_task
    from surgery.compress.candidates import Judge
    from surgery.compress.plan import CALIBRATION_BATCH, FISHER_EXAMPLES, refit_batches
    from surgery.compress.runtime_search import dev_parts, dev_source
    from surgery.persist.assets import resolve_model_path
    from surgery.training.refit import task_calibration_batches

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    task = load_suite_task(args.task, tokenizer, seed=args.seed, max_train=2000, max_dev=400, max_test=1000)
    original = surgery.from_pretrained(args.model, model_class="AutoModelForSequenceClassification").eval()
    calibration = task_calibration_batches(task.data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                           batch_size=CALIBRATION_BATCH)
    refit = refit_batches(calibration)
    dev, texts = dev_source(task.data, None, "task", CALIBRATION_BATCH)
    parts, _ = dev_parts(task.data, None, "task", CALIBRATION_BATCH, dev, texts)
    judge = Judge(original=original, objective="task", runtime="openvino-int8", calibration=refit,
                  smoothing=calibration, workdir=workdir, dev=dev, tokenizer=tokenizer, max_length=64,
                  threads=args.threads, parts=parts)
    for part in parts:  # the original's own scores: computed once per run, not a candidate's cost
        judge.reference_scores(part)
    return judge


def one_candidate(judge: Any, removal: dict[str, Any], index: int, timers: Timers) -> dict[str, Any]:
    """Build candidate ``index`` as a worker does, then judge it on the rest and the pick parts."""
    from surgery.compress.candidate_pool import BuildJob, JudgeJob, build_candidate, judge_candidate

    start, cpu = time.perf_counter(), time.process_time()
    with timers.span("0 build_candidate (build, serve, screen scores, weights saved)"):
        built, _ = build_candidate(judge, BuildJob(index, removal, True, ("screen",)), save_weights=True)
    scores = dict(built.scores)
    for part in ("rest", "pick"):
        with timers.span(f"4 judge_candidate on {part} (rebuild, load, scores)"):
            scores.update(judge_candidate(judge, JudgeJob(index, removal, built.directory, built.weights, (part,))))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    digest = hashlib.sha256(json.dumps({p: s.values for p, s in sorted(scores.items())}).encode()).hexdigest()
    return {"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3), "build_seconds": round(built.seconds, 3),
            "notes": built.notes,
            "examples": {p: len(s.values) for p, s in scores.items()},
            "correct": {p: sum(s.values) for p, s in scores.items()}, "scores_sha256": digest,
            "artefact": built.digests}


def commit_of(path: Path) -> str:
    found = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:  # a copy of a tree (git archive): its label says which
        return "not a git checkout"
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--", "surgery"], capture_output=True,
                           text=True).stdout.strip()
    return found.stdout.strip() + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the fine-tuned classifier (a copy)")
    parser.add_argument("--task", default="text-source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidate", default="path-104@2.05x")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile the last round")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=RESULTS / "candidate_cost.json")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import surgery
    from surgery.measure.machine import machine_info

    tree = Path(surgery.__file__).resolve().parents[1]
    removal = candidate_removal(args.candidate, f"{args.task}|{args.seed}|max-drop-1")
    row: dict[str, Any] = {"label": args.label, "surgery": str(tree), "commit": commit_of(tree),
                           "candidate": args.candidate, "task": args.task, "seed": args.seed,
                           "threads": args.threads, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "load_before": list(os.getloadavg()), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="candidate-cost-") as tmp:
        setup_start = time.perf_counter()
        judge = setup(args, Path(tmp))
        row["setup_seconds"] = round(time.perf_counter() - setup_start, 1)
        row["int8_calibration_examples"] = sum(int(b["input_ids"].shape[0]) for b in judge.smoothing)
        for r in range(args.rounds):
            timers = Timers()
            instrument(timers)
            profiler = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
            if profiler is not None:
                profiler.enable()
            found = one_candidate(judge, removal, r + 1, timers)
            if profiler is not None:
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
                found["cprofile_top"] = text.getvalue().splitlines()
            for owner, attr, original in reversed(timers.undo):
                setattr(owner, attr, original)
            found["steps"] = dict(sorted(timers.table().items()))
            found["load"] = list(os.getloadavg())
            row["rounds"].append(found)
            print(f"[{args.label}] round {r + 1}: {found['seconds']:.1f} s, {found['cpu_seconds']:.1f} s CPU "
                  f"(load {found['load'][0]:.2f})", flush=True)
    row["machine"] = machine_info().model_dump(mode="json")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    row["lscpu"] = [line for line in lscpu if line.split(":")[0].strip() in
                    ("Model name", "CPU(s)", "Thread(s) per core", "Flags", "L3 cache")]
    row["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / "candidate_cost.lock", "w") as lock:  # paired runs end side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
        results["runs"].append(row)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

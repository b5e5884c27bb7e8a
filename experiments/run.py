"""The one experiments runner: ``python experiments/run.py STUDY`` runs a study's declarative config.

The study's ``experiments/<study>/study.toml`` says what to run (``[config]``; ``--smoke`` swaps in the
``[smoke]`` keys: tiny models from ``surgery.testing``, a few seconds). Two kinds run here, both through
the public API:

- ``compress``: ``surgery.compress`` over models x tasks x seeds x targets (each target a set of
  ``CompressConfig`` fields); a row per run: the winner, its measured speedup and interval, its test
  accuracy on the runtime it was chosen for, the reference's, retained %, the artefact's size.
- ``bench``: methods (``surgery.get_method(name)(settings)``, applied with ``surgery.convert``; with
  ``reload = true`` saved and loaded back, the CLI's path) benchmarked
  side by side against the original (``surgery.measure.bench.bench_models``); a row per model: paired
  speedup and IQR, FLOP bound, fidelity (mean and min cosine of the mean-pooled output, or the logits, to
  the original's), size.

Each run writes one record (:mod:`experiments.record`: config, machine, commit, load average, rows) to
the study's ``results/`` (or ``--out``), then re-renders the pages (``experiments/render.py``) unless
``--smoke`` or ``--no-render``. ``results`` studies (committed results only) have nothing to run.

    python experiments/run.py head_prune
    python experiments/run.py compress --smoke --out /tmp/compress-smoke.json
    python experiments/run.py --list
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: experiments/ modules
from experiments.record import ROOT, finish_record, new_record, write_record
from experiments.study import Study, StudyError, load_study, study_names

TINY = "tiny:"  # model = "tiny:bert": a tiny random model of that family (surgery.testing)


def load_model(name: str, *, task: bool, model_class: str | None = None, **fields: Any) -> Any:
    """A model by name: ``tiny:FAMILY`` (surgery.testing) or anything surgery.from_pretrained reads."""
    import surgery

    if name.startswith(TINY):
        from surgery.testing import TinySpec, tiny_model

        return tiny_model(TinySpec(name[len(TINY):], task="seq-cls" if task else "base")).eval()
    path = name.format(**fields)
    if model_class:
        return surgery.from_pretrained(path, model_class=model_class).eval()
    return surgery.from_pretrained(path).eval()


def task_splits(name: str, seed: int, cfg: dict[str, Any]) -> tuple[Any, Any]:
    """(TaskData with train and dev, the test split's loader) of a task: ``tiny`` or a suite task."""
    if name == "tiny":
        from surgery.testing import tiny_task_data

        data = tiny_task_data(cfg.get("examples", 48), seed=seed, batch_size=cfg.get("batch_size", 8))
        test = tiny_task_data(cfg.get("examples", 48), seed=seed + 1000, batch_size=cfg.get("batch_size", 8))
        return data, test.loader("eval")
    from transformers import AutoTokenizer

    from experiments.tasks import load_suite_task
    from surgery.persist.assets import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.get("tokenizer", "minilm-l6")))
    task = load_suite_task(name, tokenizer, seed=seed, max_train=cfg.get("max_train"), max_dev=cfg.get("max_dev"),
                           max_test=cfg.get("max_test"))
    return task.data, task.test_data().loader("eval")


def latency_source(cfg: dict[str, Any], model: Any) -> Any:
    """None (measured on this machine, as compress does) or, for ``latency = "shape-table"``, a table from shapes."""
    if cfg.get("latency") != "shape-table":
        return None
    from surgery.compress.latency_source import TableLatency
    from surgery.compress.shape_table import shape_latency_table

    return TableLatency({"torch": shape_latency_table(model)})


def artefact_bytes(path: Path | None, model: Any) -> int:
    """Bytes of every file under the runtime artefact, or of the model's parameters for torch (which writes none)."""
    if path is None:
        return sum(p.numel() * p.element_size() for p in model.parameters())
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def run_compress(study: Study, cfg: dict[str, Any], record: dict[str, Any]) -> None:
    """Kind ``compress``: one ``surgery.compress`` per (task, seed, target); a row each."""
    import torch

    import surgery
    from surgery.compress import CompressConfig
    from surgery.runtimes import get_runtime
    from surgery.training import accuracy

    for task in cfg["tasks"]:
        for seed in cfg["seeds"]:
            original = load_model(cfg["model"], task=True, model_class=cfg.get("model_class"), task_name=task,
                                  seed=seed, work=cfg.get("work", ""))
            data, test = task_splits(task, seed, cfg)
            reference = accuracy(original, test)
            for target, fields in cfg["targets"].items():
                config = CompressConfig(**{"threads": cfg.get("threads"), "seed": seed, **fields})
                torch.manual_seed(seed)
                start = time.perf_counter()
                result = surgery.compress(copy.deepcopy(original), data, config,
                                          latency=latency_source(cfg, original))
                seconds = time.perf_counter() - start
                report, winner = result.report, result.report.winner_result()
                if result.artefact is None:
                    test_acc = accuracy(result.model, test)
                else:
                    test_acc = get_runtime(report.runtime).accuracy(Path(result.artefact), test,
                                                                    config=result.model.config,
                                                                    threads=cfg.get("threads"))
                speedup = winner.measured_speedup if winner else None
                record["rows"].append({
                    "table": "runs", "objective": report.objective, "variant": "",
                    "task": task, "seed": seed, "target": target, "runtime": report.runtime,
                    "winner": report.winner, "speedup": speedup,
                    "speedup_share": speedup / config.speedup if speedup and config.speedup else None,
                    "speedup_interval": winner.speedup_interval if winner else None,
                    "predicted_speedup": winner.predicted_speedup if winner else None,
                    "dev_drop": winner.drop if winner else None, "reference_accuracy": reference,
                    "accuracy": test_acc, "retained": 100.0 * test_acc / reference if reference else None,
                    "size_bytes": artefact_bytes(result.artefact, result.model), "minutes": seconds / 60,
                    "why": report.why, "warnings": report.warnings,
                })


def pooled(model: Any, batch: dict[str, Any]) -> Any:
    """The model's output per sequence: logits, or token states mean-pooled over the attention mask."""
    from surgery.testing import main_output

    out = main_output(model, batch)
    if out.dim() == 3:
        mask = batch.get("attention_mask")
        weights = (mask if mask is not None else out.new_ones(out.shape[:2])).unsqueeze(-1).to(out.dtype)
        out = (out * weights).sum(1) / weights.sum(1)
    return out


def fidelity(models: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """(mean, min) cosine of each model's output per sequence (:func:`pooled`) to the first model's."""
    import torch

    names = list(models)
    sims: dict[str, list[Any]] = {n: [] for n in names}
    with torch.inference_mode():
        for batch in inputs:
            ref = pooled(models[names[0]], batch)
            for name in names:
                sims[name].append(torch.nn.functional.cosine_similarity(pooled(models[name], batch), ref, dim=-1))
    return {n: (float(torch.cat(v).mean()), float(torch.cat(v).min())) for n, v in sims.items()}


def fidelity_inputs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Batches the fidelity is measured on: tiny random ids, or the first texts of a registered table."""
    if cfg["model"].startswith(TINY):
        from surgery.testing import TinySpec, tiny_inputs

        # batch < seq: tiny_inputs pads row b by b tokens, so every row keeps a real token
        return [tiny_inputs(TinySpec(cfg["model"][len(TINY):]), batch=6, seq=12, seed=s) for s in range(2)]
    from transformers import AutoTokenizer

    from surgery.data.task_data import read_table
    from surgery.persist.assets import resolve_model_path

    texts = read_table(cfg.get("fidelity_table", "rotten-tomatoes"))["text"][:cfg.get("fidelity_texts", 256)]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg["model"]))
    return [dict(tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=cfg.get("seq_len", 64),
                           return_tensors="pt")) for i in range(0, len(texts), 32)]


def run_bench(study: Study, cfg: dict[str, Any], record: dict[str, Any]) -> None:
    """Kind ``bench``: each method applied to a copy of the model, all benchmarked side by side; a row per model."""
    import surgery
    from surgery.measure.bench import bench_models

    original = load_model(cfg["model"], task=False)
    models = {"original": original}
    with tempfile.TemporaryDirectory(prefix="surgery-run-") as work:
        for i, method in enumerate(cfg["methods"]):
            model = copy.deepcopy(original)
            surgery.convert(model, surgery.get_method(method["method"])(method.get("settings", {})))
            if cfg.get("reload", False):  # the CLI's path: saved, then loaded back by replaying its steps
                model = surgery.from_pretrained(surgery.save_pretrained(model, Path(work) / str(i))).eval()
            models[method["name"]] = model
    cosine = fidelity(models, fidelity_inputs(cfg))
    report = bench_models(models, batch_size=cfg.get("batch_size", 32), seq_len=cfg.get("seq_len", 64),
                          repeats=cfg.get("repeats", 10), warmup=cfg.get("warmup", 2), threads=cfg.get("threads", 1))
    comps = {c.name: c for c in report.comparisons}
    for m in report.models:
        c = comps.get(m.name)
        shape = surgery.inspect(models[m.name]).layers
        record["rows"].append({
            "name": m.name, "heads": sum(layer.heads for layer in shape),
            "ffn_width": sum(layer.ffn_width for layer in shape), "params": m.params.total,
            "params_without_embeddings": m.params.without_embeddings, "gflops": m.flops_per_batch / 1e9,
            "throughput": m.throughput, "latency_p50_ms": m.latency_p50_ms, "latency_p95_ms": m.latency_p95_ms,
            "size_bytes": m.weights_bytes, "peak_mib": m.peak_memory_bytes / 2**20,
            "speedup": c.paired_speedup if c else 1.0, "mean_speedup": c.speedup if c else 1.0,
            "speedup_interval": list(c.paired_speedup_iqr) if c else None,
            "speedup_ci": list(c.paired_speedup_ci) if c and c.paired_speedup_ci else None,
            "flop_bound": c.flop_bound_speedup if c else 1.0, "share_of_bound": c.fraction_of_flop_bound if c else None,
            "fidelity": cosine[m.name][0], "fidelity_min": cosine[m.name][1],
        })
    record["notes"] += [f"warning: {w}" for w in report.warnings]


KINDS = {"compress": run_compress, "bench": run_bench}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a study from its experiments/<study>/study.toml.")
    parser.add_argument("study", nargs="?", help="the study's folder name under experiments/")
    parser.add_argument("--smoke", action="store_true", help="the study's [smoke] settings: tiny models, seconds")
    parser.add_argument("--out", type=Path, help="where to write the record (default: the study's results/)")
    parser.add_argument("--no-render", action="store_true", help="do not re-render the pages after the run")
    parser.add_argument("--list", action="store_true", help="list the studies and their kinds")
    args = parser.parse_args(argv)
    if args.list:
        for name in study_names():
            spec = load_study(name)
            print(f"{name:22} {spec.kind:9} {spec.question}")
        return 0
    if not args.study:
        parser.error("name a study (python experiments/run.py --list)")
    try:
        study = load_study(args.study)
        if study.kind not in KINDS:
            raise StudyError(f"{args.study} is a {study.kind!r} study: its committed results are rendered "
                             f"(python experiments/render.py), there is nothing to run")
        cfg = study.settings(smoke=args.smoke)
        missing = [k for k in ({"compress": ("model", "tasks", "seeds", "targets"),
                                "bench": ("model", "methods")}[study.kind]) if k not in cfg]
        if missing:
            raise StudyError(f"experiments/{args.study}/study.toml: [config] lacks {', '.join(missing)}")
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or study.folder / "results" / (f"smoke-{study.record}" if args.smoke else study.record)
    command = " ".join(["python experiments/run.py", *(argv if argv is not None else sys.argv[1:])])
    record = new_record(study.name, out.stem, command=command, config=cfg)
    start = time.perf_counter()
    KINDS[study.kind](study, cfg, record)
    write_record(finish_record(record, time.perf_counter() - start), out)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} ({len(record['rows'])} rows)")
    if not (args.smoke or args.no_render or args.out):
        from experiments.render import main as render

        return render([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

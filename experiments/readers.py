"""Readers: each committed results file of a study written before the runner, mapped to the record schema.

A reader takes the file's path and returns a record (:mod:`experiments.record`): the file's own
figures as rows, unchanged (no number is retyped or recomputed beyond a ratio of two of them), its
setup as ``config``, its machine where it recorded one. ``study.toml`` names the reader of each legacy
file; files that ``experiments/run.py`` writes are records already and need none.

Example:
    >>> from experiments.study import EXPERIMENTS
    >>> rec = READERS["refit"](EXPERIMENTS / "refit" / "results" / "refit_probe.json")
    >>> rec["rows"][0]["name"], round(rec["rows"][0]["fidelity"], 3)
    ('pruned, no refit', 0.611)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.record import ROOT, SCHEMA_VERSION


def legacy(path: Path, *, source: str, config: dict[str, Any], rows: list[dict[str, Any]],
           machine: dict[str, Any] | None = None, commit: str | None = None, date: str | None = None,
           load: list[float] | dict[str, Any] | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """A record for a legacy file: its rows and what it says of its run."""
    if isinstance(load, list):
        load = {"before": load[0] if load else None, "after": load[-1] if load else None}
    return {"schema": SCHEMA_VERSION, "study": path.parent.parent.name, "run": path.stem, "source": source,
            "command": None, "date": date, "commit": commit, "seconds": None, "machine": machine,
            "load_average": load or {}, "config": config, "rows": rows, "notes": notes or []}


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _bench_rows(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model of a ``surgery.measure.bench`` report, its comparison with the reference merged in."""
    comps = {c["name"]: c for c in bench["comparisons"]}
    rows = []
    for m in bench["models"]:
        c = comps.get(m["name"])
        rows.append({
            "name": m["name"], "params": m["params"]["total"], "params_without_embeddings":
            m["params"]["without_embeddings"], "gflops": m["flops_per_batch"] / 1e9, "throughput": m["throughput"],
            "latency_p50_ms": m["latency_p50_ms"], "latency_p95_ms": m["latency_p95_ms"],
            "size_bytes": m.get("weights_bytes"), "peak_mib": (m.get("peak_memory_bytes") or 0) / 2**20,
            "speedup": c["paired_speedup"] if c else 1.0, "mean_speedup": c["speedup"] if c else 1.0,
            "speedup_interval": c["paired_speedup_iqr"] if c else None,
            "speedup_ci": c.get("paired_speedup_ci") if c else None,
            "flop_bound": c["flop_bound_speedup"] if c else 1.0,
            "share_of_bound": c["fraction_of_flop_bound"] if c else None, "accuracy": m.get("accuracy"),
        })
    return rows


def _bench_machine(settings: dict[str, Any], recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """The machine a bench report ran on: its ``machine`` (surgery.measure.machine.machine_info: the CPU model and
    flags) where it has one, else the facts its settings kept before machine_info existed."""
    if recorded:
        return {**recorded, "torch_threads": recorded.get("torch_threads") or settings.get("threads")}
    return {"cpu_model": settings.get("machine", "?"), "logical_cpus": settings.get("cpu_count"),
            "torch_threads": settings.get("threads"), "torch_version": settings.get("torch_version")}


def read_head_prune(path: Path) -> dict[str, Any]:
    d = _json(path)
    rows = _bench_rows(d["bench"])
    for row in rows:
        shape = d["anatomy"][row["name"]]
        row["heads"], row["ffn_width"] = sum(shape["heads"]), sum(shape["ffn_width"])
        cos = d["fidelity"]["cosine"].get(row["name"])
        row["fidelity"], row["fidelity_min"] = (cos["mean"], cos["min"]) if cos else (1.0, 1.0)
    s = d["bench"]["settings"]
    config = {"model": "minilm-l6", "fidelity_texts": d["fidelity"]["snippets"], "interval": "IQR of paired rounds",
              **{k: s[k] for k in ("batch_size", "seq_len", "repeats", "warmup", "threads", "torch_version")}}
    return legacy(path, source=d["command"], config=config, rows=rows, machine=_bench_machine(s),
                  commit=d["git"]["commit"], date=d["date"],
                  load={"before": s["load_average_before"], "after": s["load_average_after"]},
                  notes=[f"warning: {w}" for w in d["bench"]["warnings"]])


def _compress_row(key: str, run: dict[str, Any]) -> dict[str, Any]:
    row = {k: run.get(k) for k in ("task", "seed", "target", "runtime", "winner", "predicted_speedup", "dev_drop",
                                  "speedup_target", "budget_minutes", "why")}
    row.update(table="runs", name=key, speedup=run.get("measured_speedup"),
               speedup_interval=run.get("speedup_interval"),
               reference_accuracy=run.get("finetuned_test"), accuracy=run.get("test"), retained=run.get("retained"),
               fidelity=run.get("test_cosine"), recall_at_10=run.get("test_recall_at_10"),
               minutes=run["seconds"] / 60 if run.get("seconds") else None,
               variant=key.split("|")[3] if key.count("|") >= 3 else "",
               objective=run.get("objective") or ("embedding" if run.get("test_cosine") is not None else "task"),
               speedup_share=(run["measured_speedup"] / run["speedup_target"]
                              if run.get("measured_speedup") and run.get("speedup_target") else None),
               size_bytes=(run.get("artefact") or {}).get("bytes"))
    peer = run.get("peer") or {}
    row.update(vs_peer=peer.get("vs_peer"), vs_peer_interval=peer.get("vs_peer_interval"),
               peer_retained=peer.get("peer_retained"), peer_speedup=peer.get("peer_speedup"),
               peer_fidelity=peer.get("peer_test_cosine"), peer_recall_at_10=peer.get("peer_test_recall_at_10"))
    return row


def read_compress(path: Path) -> dict[str, Any]:
    """compress.json / compress_runtimes*.json (experiments/compress*/bench_*.py): one row per run."""
    d = _json(path)
    rows = [_compress_row(k, r) for k, r in d["runs"].items()]
    rows += [{"table": "runtimes", "target": r["target"], "seed": r["seed"], **rt,
              "unchanged_ratio": rt.get("unchanged_ratio") if rt.get("available") else None}
             for r in d["runs"].values() for rt in (r.get("runtimes") or [])]
    loads = [x for r in d["runs"].values() for x in (r.get("load_average") or [])]
    commits = sorted({r["commit"] for r in d["runs"].values() if r.get("commit")})
    return legacy(path, source=f"experiments/{path.parent.parent.name}/bench_{path.parent.parent.name}.py",
                  config={"interval": "bootstrap 95% of paired rounds", "threads": d.get("threads")}, rows=rows,
                  machine=d.get("machine"), commit=", ".join(commits) or None,
                  load={"before": min(loads), "after": max(loads)} if loads else None)


def read_openvino_export(path: Path) -> dict[str, Any]:
    """openvino_export.json: speed rows per thread count, fidelity rows per model."""
    d = _json(path)
    rows: list[dict[str, Any]] = []
    for threads, s in d["speed"].items():
        for pair, name in (("surgery_vs_peer", "surgery / peer"), ("surgery_vs_torch_fp32", "surgery / torch fp32"),
                           ("peer_vs_torch_fp32", "peer / torch fp32")):
            x = s[pair]
            rows.append({"table": "speed", "threads": int(threads), "name": name, "speedup": x["median"],
                         "speedup_interval": [x["low"], x["high"]], "rounds": x["rounds"]})
    for name, f in d["fidelity"]["models"].items():
        rows.append({"table": "fidelity", "name": name, "fidelity": f["mean_cosine"], "recall_at_10":
                     f["recall_at_10"], "long_fidelity": f["long_mean_cosine"], "long_min": f["long_min_cosine"],
                     "size_bytes": d["surgery_export"]["ir_bytes"] if name.startswith("surgery") else None})
    for name, t in d["targets"].items():
        rows.append({"table": "targets", "name": name, "measured": t["measured"], "wanted": t["target"],
                     "met": "met" if t["met"] else "**missed**"})
    config = {"texts": d["fidelity"]["texts"], "long_documents": d["fidelity"]["long_documents"],
              "calibration_texts": d["peer"]["calibration_texts"], "interval": "bootstrap 95% of paired rounds",
              "versions": d["surgery_export"]["versions"]}
    loads = [x for s in d["speed"].values() for x in s["load_average"]]
    return legacy(path, source="experiments/openvino_export/bench_openvino_export.py", config=config, rows=rows,
                  machine=d["machine"], load={"before": loads[0], "after": loads[-1]})


GRAPHS = ("ort fp32 unfused", "ort fp32 fused", "int8 dynamic unfused", "int8 dynamic", "int8 static")


def read_graph_speed(path: Path) -> dict[str, Any]:
    """graph_speed.json: one row per (family, threads, model), each graph's ratio against the original."""
    d = _json(path)
    rows = []
    for family, by_threads in d["timing"].items():
        for threads, t in by_threads.items():
            models = sorted({k.split(" | ")[0] for k in t["rows"]}, key=lambda m: (m != "original", m))
            for model in models:
                row: dict[str, Any] = {"family": family, "threads": int(threads), "name": model}
                for graph in ("torch fp32", *GRAPHS):
                    cell = t["rows"].get(f"{model} | {graph}")
                    if cell is not None:
                        row[graph], row[f"{graph} ci"] = cell["paired_speedup"], cell["ci95"]
                    elif graph == "torch fp32" and model == "original":
                        row[graph] = 1.0  # the reference itself
                rows.append(row)
    return legacy(path, source="experiments/graph_speed/bench_graphs.py",
                  config={"interval": "bootstrap 95% of paired rounds"}, rows=rows, machine=d.get("machine_at_save"))


def read_refit(path: Path) -> dict[str, Any]:
    """refit_probe*.json: the pruned model, then the refit at each ridge."""
    d = _json(path)
    s = d["setup"]
    base = {"calibration_batches": s["calibration_batches"]}
    rows = [{**base, "name": "pruned, no refit", "fidelity": d["pruned"]["mean_cosine"],
             "recall_at_10": d["pruned"]["recall_at_10"]}]
    for ridge, r in d["refit"].items():
        rows.append({**base, "name": f"refit, ridge {ridge}", "fidelity": r["mean_cosine"],
                     "recall_at_10": r["recall_at_10"], "seconds": r["seconds"], "tokens": r["tokens"]})
    return legacy(path, source="experiments/refit/probe_refit.py", config=s, rows=rows,
                  machine={"torch_threads": s["threads"]})


def read_stock_interop(path: Path) -> dict[str, Any]:
    """stock_interop's result.json: stock libraries on save_stock's directory against surgery's own outputs."""
    d = _json(path)
    a, st = d["automodel"], d["sentence_transformers"]
    missing = len(a["missing_keys"]) + len(a["unexpected_keys"]) + len(a["mismatched_keys"])
    rows = [{"name": f"transformers AutoModel ({a['class']})", "texts": a["texts"],
             "max_abs_diff": a["max_abs_diff_token_states"], "fidelity": None, "key_problems": missing},
            {"name": "sentence-transformers SentenceTransformer", "texts": st["texts"],
             "max_abs_diff": st["max_abs_diff"], "fidelity": st["mean_cosine"], "fidelity_min": st["min_cosine"],
             "key_problems": None}]
    config = {"what": d["what"], "structure": d["structure"], "versions": d["versions"],
              "surgery_installed": d["surgery_installed"]}
    return legacy(path, source="scripts/check_stock_interop.sh", config=config, rows=rows)


def read_families(path: Path) -> dict[str, Any]:
    """families.json: one row per (family, method) at base size."""
    d = _json(path)
    rows, loads = [], []
    for family, e in d["families"].items():
        st = e["settings"][0]
        loads += [x for x in e["shared_machine_load"] if x is not None]
        for method, m in e["methods"].items():
            rows.append({"family": family, "name": method, "size_of": e["checkpoint_size_of"], "layers": e["layers"],
                         "attention": e["attention"], "gflops": e["original"]["flops_per_batch"] / 1e9,
                         "speedup": m["paired_speedup"], "speedup_interval": m["ci95"],
                         "flop_bound": m["flop_bound_speedup"], "share_of_bound": m["share_of_bound"],
                         "half_width": m["half_width"], "rounds": sum(x["repeats"] for x in e["settings"]),
                         "batch": f"{st['batch_size']}x{st['seq_len']}", "date": e["date"]})
    first = next(iter(d["families"].values()))["settings"][0]
    return legacy(path, source="experiments/families/bench_families.py",
                  config={"interval": "bootstrap 95% of paired rounds", "threads": first["threads"],
                          "torch_version": first["torch_version"]}, rows=rows,
                  machine={"cpu_model": first.get("machine"), "logical_cpus": first["cpu_count"],
                           "torch_threads": first["threads"]},
                  load={"before": min(loads), "after": max(loads)} if loads else None)


def read_top1(path: Path) -> dict[str, Any]:
    """top1_mechanisms.json: one row per (task, variant), mean and std over seeds."""
    d = _json(path)
    rows = [{"task": c["task"], "name": c["variant"], "seeds": ",".join(map(str, c["seeds"])),
             "accuracy": c["test_final"], "routed": c["test_routed"], "cut_loss": c["cut_loss"],
             "cut_loss_max": c["cut_loss_max"], "vs_today_routed": c["loss_vs_today_routed"]}
            for c in d["summary"].values()]
    return legacy(path, source="experiments/top1_mechanisms/compare_top1.py", config={"unit": "accuracy points"},
                  rows=rows)


def read_suite(path: Path) -> dict[str, Any]:
    """suite*.json: the method table (mean ± std over seeds) and the paired variant table."""
    d = _json(path)
    suite = d["suite"]
    rows = [{"table": "methods", "task": c["task"], "name": c["method"], "seeds": ",".join(map(str, c["seeds"])),
             "accuracy": c["test"], "retained": c["retained"], "cut_loss": c["cut_loss_dev"],
             "params_without_embeddings": c["params_without_embeddings"], "speedup": c["speedup"],
             "flop_bound": c["flop_bound_speedup"]} for c in suite["table"]]
    rows += [{"table": "paired", "task": c["task"], "name": c["method"], "base": c["base"],
              "seeds": ",".join(map(str, c["seeds"])), "dev": c["dev"], "test": c["test"],
              "dev_wins": f"{c['dev_wins']}/{len(c['seeds'])}"} for c in suite.get("paired", [])]
    runs = list(d["runs"].values())
    bench = d.get("bench")
    config = {"trained_on": ", ".join(sorted({r.get("device", "cpu") for r in runs})),
              "train_sizes": "/".join(map(str, sorted({r["data"]["train_size"] for r in runs}))),
              "speed_from": f"{bench['task']} seed {bench['seed']}" if bench else "not measured"}
    s = bench["report"]["settings"] if bench else {}
    return legacy(path, source="experiments/suite/bench_suite.py", config=config, rows=rows,
                  machine=_bench_machine(s) if s else None,
                  load={"before": s.get("load_average_before"), "after": s.get("load_average_after")} if s else None)


def read_shrp(path: Path) -> dict[str, Any]:
    """shrp.json: the baseline, every SHRP variant and the pruning baselines at SHRP's size; bench merged in."""
    d = _json(path)
    setup, base = d["setup"], d["baseline"]
    bench = {r["name"]: r for r in _bench_rows(d["bench"])} if "bench" in d else {}
    rows = [{"name": "baseline", "epochs": setup["baseline_epochs"], "accuracy": base["accuracy"], "before": None,
             "params": base["params"]["total"], "params_without_embeddings": base["params"]["without_embeddings"]}]
    for key, r in d.items():
        if key.startswith("shrp-"):
            rows.append({"name": key, "epochs": len(r["layers"]) + setup["extra_epochs"],
                         "accuracy": r["accuracy_pruned"], "before": r["accuracy_moe"], "params": r["params"]["total"],
                         "params_without_embeddings": r["params"]["without_embeddings"]})
        elif "@" in key:
            rows.append({"name": key, "epochs": r.get("recovery_epochs"), "accuracy": r["accuracy"],
                         "before": r["accuracy_before_recovery"], "params": r["params"]["total"],
                         "params_without_embeddings": r["params"]["without_embeddings"]})
    for row in rows:
        row["share_of_baseline"] = row["accuracy"] / base["accuracy"]
        b = bench.get(row["name"])
        if b:
            row.update({k: b[k] for k in ("gflops", "throughput", "speedup", "mean_speedup", "speedup_interval",
                                          "flop_bound")})
    s = d["bench"]["settings"] if "bench" in d else {}
    notes = [f"{k}: per-layer expert usage " + "; ".join(f"layer {layer}: {u}" for layer, u in
                                                          sorted(d[k]["usage"].items(), key=lambda t: int(t[0])))
             for k in d if k.startswith("shrp-") and d[k].get("usage")]
    return legacy(path, source="experiments/shrp/bench_shrp.py", config={**setup, "interval": "IQR of paired rounds"},
                  rows=rows, machine=_bench_machine(s) if s else None,
                  load={"before": s.get("load_average_before"), "after": s.get("load_average_after")} if s else None,
                  notes=notes + [f"warning: {w}" for w in d.get("bench", {}).get("warnings", [])])


def read_doe(path: Path) -> dict[str, Any]:
    """doe.json: fine-tuned, prompt-tuned and DoE rows; the figures' probes as notes."""
    d = _json(path)
    comps = {c["name"]: c for c in d["speed"]["comparisons"]} if "speed" in d else {}
    ft, pt, doe = d.get("fine_tuning", {}), d.get("prompt_tuning", {}), d.get("doe", {})

    def speed(name: str) -> dict[str, Any]:
        c = comps.get(name)
        return {"speedup": c["paired_speedup"], "mean_speedup": c["speedup"], "flop_bound": c["flop_bound_speedup"],
                "share_of_bound": c["fraction_of_flop_bound"]} if c else {}

    rows = [{"name": f"fine-tuned (all weights, {ft.get('epochs')} epoch(s))", "accuracy": ft.get("accuracy"),
             "pruned": 0.0, **speed("fine-tuned")},
            {"name": "prompt-tuned (reference)", "accuracy": pt.get("accuracy"), "pruned": 0.0, "speedup": 1.0,
             "flop_bound": 1.0}]
    notes = []
    if doe:
        rows.append({"name": "DoE", "accuracy": doe["accuracy"], "pruned": doe["pruning_rate"],
                     "units": f"{doe['units_removed']}/{doe['units_total']}", "drop": pt["accuracy"] - doe["accuracy"],
                     **speed("doe")})
        notes.append("binary search probes (accuracy after condensation): " + ", ".join(
            f"p={p['p']:.2f}: {p['accuracy']:.1f} ({'accepted' if p['accepted'] else 'rejected'})"
            for p in doe["search"]["probes"]))
    if "table4_condensation" in d:
        t4 = d["table4_condensation"]
        notes.append(f"Table 4 (condensation) at p = {t4['pruning_rate']:.2f}: with {t4['with_condensation']:.1f}, "
                     f"without {t4['without_condensation']:.1f}")
    if "figure5_importance_at_50pct" in d:
        notes.append("Figure 5 (importance at 50% pruned): " + ", ".join(
            f"{k} {v['accuracy']:.1f} ({v['accuracy_before_condensation']:.1f} before condensation)"
            for k, v in d["figure5_importance_at_50pct"].items()))
    if "figure6_module_sets_at_30pct" in d:
        notes.append("Figure 6 (module sets at 30% pruned): " + "; ".join(
            f"{k}: accuracy {v['accuracy']:.1f}, speedup {v.get('speedup', float('nan')):.2f}x of a "
            f"{v.get('flop_bound_speedup', float('nan')):.2f}x bound"
            for k, v in d["figure6_module_sets_at_30pct"].items()))
    if "figures_rerun" in d:
        fr = d["figures_rerun"]
        notes.append(f"Table 4 and Figures 5-6 come from a second invocation (`--figures-only`) whose prompt-tuned "
                     f"model scored {fr['prompt_tuned_accuracy']:.1f}: {fr.get('why', '-')}")
    s = d["speed"]["settings"] if "speed" in d else {}
    return legacy(path, source="experiments/doe/bench_doe.py", config={**d["setup"], "status": d.get("status")},
                  rows=rows, machine=_bench_machine(s) if s else None,
                  load={"before": s.get("load_average_before"), "after": s.get("load_average_after")} if s else None,
                  notes=notes)


def read_deploy(path: Path) -> dict[str, Any]:
    """deploy.json: one row per (model, runtime) of the bench; the headline ratios (SHRP int8 against the
    original) as rows too."""
    d = _json(path)
    trained = d["setup"].get("trained", True)
    rows = []
    for r in _bench_rows(d["bench"]):
        name, runtime = r["name"].split(" [")
        rows.append({**r, "table": "bench", "name": name, "runtime": runtime.rstrip("]"),
                     "accuracy": r["accuracy"] if trained else None})
    h, t, base = d["headline"], d["targets"], d["bert_base_export"]
    for key, text in (("speedup_vs_original_fp32", "SHRP int8 in ORT vs original fp32 PyTorch"),
                      ("speedup_vs_original_int8", "SHRP int8 vs original int8 (both ORT)")):
        rows.append({"table": "targets", "name": text, "speedup": h[key]["median"],
                     "speedup_interval": [h[key]["q1"], h[key]["q3"]], "wanted": t[key]})
    rows.append({"table": "targets", "name": f"export of a {base['params'] / 1e6:.0f}M-parameter model, seconds",
                 "seconds": base["export_seconds"], "wanted": t["bert_base_export_seconds"]})
    s = d["bench"]["settings"]
    drift = d["export"]["int8_drift"]
    notes = [f"the SHRP export: fp32 parity {d['export']['parity']['max_abs_diff']:.1e} (max abs), int8 drift "
             f"{drift['max_abs_diff']:.2e} (min cosine {drift['min_cosine']:.4f})"]
    if not trained:
        notes.append("speed only: the SHRP row is the recipe's structure without its training (`--standin`), so "
                     f"accuracy and the {t['accuracy_share']:.0%} accuracy target are not measured")
    return legacy(path, source="experiments/deploy/bench_deploy.py",
                  config={**d["setup"], "interval": "IQR of paired rounds",
                          "int8": "per channel" if d["export"].get("int8_per_channel") else "per tensor"},
                  rows=rows, machine=_bench_machine(s), commit=d["generated"]["commit"], date=d["generated"]["date"],
                  load={"before": s["load_average_before"], "after": s["load_average_after"]},
                  notes=notes + [f"warning: {w}" for w in d["bench"]["warnings"]])


def read_demo(path: Path) -> dict[str, Any]:
    """demo_shrp.json (scripts/demo.sh's outputs): the fine-tuned model before, the SHRP model after."""
    d = _json(path)
    report, bench = d["report"], d["bench"]
    m = report["metrics"]
    tuned = next((h["eval_acc"] for h in m["history"] if h.get("stage") == 0), None)
    c = bench["comparisons"][0]
    by_name = {r["name"]: r for r in _bench_rows(bench)}
    layers = report["config"].get("num_layers") or len(m.get("layers", []))
    rows = [{**by_name[c["reference"]], "name": "before: minilm-l6, fine-tuned 1 epoch (stage 0)", "accuracy": tuned},
            {**by_name[c["name"]], "name": f"after: SHRP, {layers} of 6 layers single-head",
             "accuracy": m["accuracy_pruned"], "before": m["accuracy_moe"]}]
    s = bench["settings"]
    config = {"eval_size": m["data"]["eval_size"], "routed_accuracy": m["accuracy_moe"],
              **{k: s[k] for k in ("batch_size", "seq_len", "repeats", "threads")}}
    return legacy(path, source=d["command"], config=config, rows=rows, commit=d["commit"],
                  machine=_bench_machine(s, bench.get("machine")),
                  load={"before": s.get("load_average_before"), "after": s.get("load_average_after")})


def read_latency_prediction(path: Path) -> dict[str, Any]:
    """results-*.json (experiments/latency_prediction/predict_vs_measured.py): predicted against measured speedup."""
    d = _json(path)
    rows = []
    for m in d["models"]:
        for r in m["rows"]:
            rows.append({"model": m["model"], "runtime": m["runtime"], "batch": f"{m['batch_size']} x {m['seq_len']}",
                         "name": r["structure"], "predicted_speedup": r["predicted"], "speedup": r["measured"],
                         "speedup_interval": r["measured_ci95"], "error": r["error"], "abs_error": abs(r["error"]),
                         "inside": r["measured_ci95"][0] <= r["predicted"] <= r["measured_ci95"][1],
                         "flop_bound": r.get("flop_bound"), "own_error": r.get("error_vs_own_original"),
                         "own_predicted": r.get("predicted_vs_own_original"),
                         "own_measured": r.get("measured_vs_own_original")})
    return legacy(path, source="experiments/latency_prediction/predict_vs_measured.py",
                  config={**d["args"], "interval": "bootstrap 95% of paired rounds"}, rows=rows, machine=d["machine"],
                  load={"before": d.get("load_before"), "after": d.get("load_after")})


def read_st_runtimes(path: Path) -> dict[str, Any]:
    """st_runtimes*.json: each backend's speedup over sentence-transformers in PyTorch fp32, and its fidelity."""
    d = _json(path)
    rows = []
    for backend, fid in d["fidelity"].items():
        row: dict[str, Any] = {"table": "backends", "name": backend, "fidelity": fid["mean_cosine"],
                               "recall_at_10": fid["recall@10"]}
        for threads, by_backend in d["speedups"].items():
            x = by_backend.get(backend)
            if x is not None:
                row[f"speedup_{threads}"], row[f"interval_{threads}"] = x["speedup"], [x["low"], x["high"]]
        rows.append(row)
    for threads, by_peer in d["surgery_against_st_int8"].items():
        for peer, x in by_peer.items():
            rows.append({"table": "against", "threads": int(threads), "name": f"surgery-int8 / {peer}",
                         "speedup": x["speedup"], "speedup_interval": [x["low"], x["high"]], "rounds": x["rounds"]})
    cpu = d["machine"]["cpu"]
    machine = {"cpu_model": cpu["model"], "logical_cpus": cpu["logical_cpus"],
               "flags": [f for f, has in cpu["flags"].items() if has]}
    loads = [x for pair in d["load_average"].values() for x in pair]
    return legacy(path, source="experiments/st_runtimes/bench_st_runtimes.py",
                  config={k: d[k] for k in ("model", "what", "speedup", "eval_texts", "calibration_texts", "rounds",
                                            "versions")}, rows=rows, machine=machine,
                  load={"before": min(loads), "after": max(loads)} if loads else None)


def read_int8(path: Path) -> dict[str, Any]:
    """int8_smoothing*.json: embedding fidelity per graph (mean ± std over seeds), classifier accuracy, speed."""
    d = _json(path)
    emb = d["embeddings"]
    rows = [{"table": "embeddings", "name": graph, "seeds": x["seeds"], "fidelity": x["mean_cosine"],
             "recall_at_10": x["recall_at_10"], "worst_probe": x["worst_probe_delta_points"],
             **{f"probe {task}": v for task, v in x["probe_delta_points"].items()}}
            for graph, x in emb["summary"].items()]
    for graph, x in (d.get("classifiers") or {}).get("summary", {}).items():
        rows.append({"table": "classifiers", "name": graph, "runs": x["runs"],
                     "accuracy_delta": x["accuracy_delta_points"], "changed": x["changed_predictions_percent"]})
    if "speed" in d:
        rows += [{**r, "table": "speed"} for r in _bench_rows(d["speed"])]
    setup = emb["setup"]
    machine = emb.get("machine") or (d.get("classifiers") or {}).get("machine")
    return legacy(path, source="experiments/int8/probe_int8_smoothing.py",
                  config={**setup, "default_alpha": d["default_alpha"], "machine_note": d["machine"]}, rows=rows,
                  machine=machine if isinstance(machine, dict) else None)


def read_embed(path: Path) -> dict[str, Any]:
    """embed_*.json (experiments/embeddings/bench_embed.py --merge): one row per variant, mean ± std over seeds."""
    d = _json(path)
    speed = {}
    if "bench" in d:
        for r in _bench_rows(d["bench"]):
            name, runtime = r["name"].split(" [")
            speed.setdefault(name, {})[runtime.rstrip("]")] = r["speedup"]
    teacher_int8 = d["summary"].get("teacher [int8]", {})
    # The teacher against itself: cosine and recall 1 and no probe loss by definition; its int8 graph is measured.
    rows = [{"name": "teacher (all-MiniLM-L6-v2)", "seeds": len(d["teacher"]), "fidelity": [1.0, 0.0],
             "recall_at_10": [1.0, 0.0], "worst_probe": [0.0, 0.0],
             "int8_fidelity": teacher_int8.get("mean_cosine"), "int8_recall_at_10": teacher_int8.get("recall_at_k"),
             "speedup": (speed.get("teacher") or {}).get("torch"),
             "int8_speedup": (speed.get("teacher") or {}).get("onnxruntime int8")}]
    for name, x in d["summary"].items():
        if name == "teacher [int8]":
            continue
        paired = x.get("paired")
        rows.append({"name": name, "seeds": len(x["seeds"]), "epochs": x["epochs"], "params": x["params"]["total"],
                     "params_without_embeddings": x["params"]["without_embeddings"], "fidelity": x["mean_cosine"],
                     "recall_at_10": x["recall_at_k"], "worst_probe": x["worst_probe_points"],
                     "int8_fidelity": (x.get("int8") or {}).get("mean_cosine"),
                     "int8_recall_at_10": (x.get("int8") or {}).get("recall_at_k"),
                     "speedup": (speed.get(name) or {}).get("torch"),
                     "int8_speedup": (speed.get(name) or {}).get("onnxruntime int8"),
                     "paired_fidelity": paired["mean_cosine"] if paired else None,
                     "paired_recall": paired["recall_at_k"] if paired else None,
                     "paired_wins": f"{paired['wins'][0]} and {paired['wins'][1]} of {paired['n']}"
                     if paired else None})
    s = d["bench"]["settings"] if "bench" in d else {}
    return legacy(path, source="experiments/embeddings/bench_embed.py", config=d["setup"], rows=rows,
                  machine=_bench_machine(s) if s else None,
                  load={"before": s.get("load_average_before"), "after": s.get("load_average_after")} if s else None,
                  notes=[d["note"]] if d.get("note") else [])


def read_openvino_bf16(path: Path) -> dict[str, Any]:
    """openvino_bf16.json: MiniLM speed and fidelity per runtime, then the bf16 tolerance of every tiny family."""
    d = _json(path)
    m = d["minilm"]
    rows = [{"table": "minilm", "name": rt, "median_ms": m[rt]["median_ms"], "speedup": m[rt]["speedup"],
             "speedup_interval": [m[rt]["speedup_low"], m[rt]["speedup_high"]], "fidelity": m[rt]["mean_cosine"]}
            for rt in ("torch", "torch-bf16", "openvino", "openvino-bf16") if rt in m]
    for t in d["tolerance"]:
        rows.append({"table": "tolerance", "family": t["family"], "task": t["task"],
                     "ov_bf16_max_abs": t["openvino-bf16"]["max_abs_diff"],
                     "ov_bf16_min_cos": t["openvino-bf16"]["min_cosine"],
                     "torch_bf16_max_abs": t["torch-bf16"]["max_abs_diff"],
                     "torch_bf16_min_cos": t["torch-bf16"]["min_cosine"]})
    cpu = d["cpu"]
    machine = {"cpu_model": cpu["model_name"], "logical_cpus": cpu["cpus"], "flags": cpu["bf16_flags"],
               "torch_threads": m["setting"]["threads"]}
    return legacy(path, source="experiments/openvino_bf16/bench_openvino_bf16.py",
                  config={**m["setting"], "versions": d["versions"], "interval": "bootstrap 95% of paired rounds"},
                  rows=rows, machine=machine, load={"before": d["load_before"][0], "after": d["load_after"][0]})


def read_recovery_tiers(path: Path) -> dict[str, Any]:
    """recovery_tiers.json: dev and test accuracy of each recovery tier after one cut, and its points per minute."""
    d = _json(path)
    rows = []
    for t in d["tiers"].values():
        base = {"task": t["task"], "seed": t["seed"], "reference_accuracy": t["original_dev"]}
        rows.append({**base, "name": "refit only", "dev": t["refit_dev"], "accuracy": t["refit_test"],
                     "seconds": t["cut"]["refit_seconds"]})
        for name, r in t["runs"].items():
            rows.append({**base, "name": name, "dev": r["dev"], "accuracy": r["test"], "seconds": r["seconds"],
                         "estimate_s": r.get("estimate_s"), "dev_per_minute": r.get("dev_points_per_minute"),
                         "test_per_minute": r.get("test_points_per_minute")})
    return legacy(path, source="experiments/recovery_tiers/bench_recovery_tiers.py --part tiers",
                  config={"cut": next(iter(d["tiers"].values()))["cut"]}, rows=rows, machine=d["machine"])


def read_serving_shapes(path: Path) -> dict[str, Any]:
    """serving_shapes.json (experiments/serving_shapes/bench_serving_shapes.py): one row per model and serving
    shape a cut was chosen at, with that winner's speedups from the side-by-side timing at every shape (under the
    shape's name: ``online.p50_speedup``, ``bulk.paired_ci95`` ...) and, for the cut chosen at the online shape,
    the share of its predicted speedup it kept there (the script's own figure)."""
    d = _json(path)
    rows, notes = [], []
    for case in d["cases"]:
        for shape, won in case["winners"].items():
            row: dict[str, Any] = {
                "model": case["model"], "shape": shape, "chosen_at": f"{shape} (batch {won['batch']})",
                "name": won["winner"], "predicted_speedup": won["predicted_speedup"],
                "compress_speedup": won["measured_speedup"], "minutes": won["seconds"] / 60,
                # The target is the online cut's alone: the script judged no share for the bulk one.
                "kept": case["online_winner_kept_of_predicted"] if shape == "online" else None}
            row.update({at: bench["comparisons"][f"{shape} winner"] for at, bench in case["side_by_side"].items()})
            rows.append(row)
        # The timing's own warnings (load, round-to-round spread), one line per side-by-side run that had any.
        notes += [f"warnings of the side-by-side timing, {case['model']} at {at} (batch {bench['batch']}): "
                  + "; ".join(bench["warnings"]) for at, bench in case["side_by_side"].items() if bench["warnings"]]
    phases = [phase for case in d["cases"] for phase in (*case["winners"].values(), *case["side_by_side"].values())]
    loads = [reading[0] for phase in phases for reading in phase["load_average"]]  # [before, after]: 1, 5, 15 min
    notes.append(f"1-minute load average over every phase: {min(loads):.1f} to {max(loads):.1f} on "
                 f"{d['machine'].get('usable_cpus') or d['machine'].get('logical_cpus')} CPUs (the run's own "
                 f"{d['settings']['threads']} threads included); {d['seconds'] / 60:.1f} minutes in all")
    config = {**{k: v for k, v in d["settings"].items() if k not in ("out", "smoke")},
              **{f"{shape}_batch": batch for shape, batch in d["shapes"].items()}}
    return legacy(path, source="experiments/serving_shapes/bench_serving_shapes.py", config=config, rows=rows,
                  machine=d["machine"], load={"before": d["load_average_start"][0], "after": d["load_average_end"][0]},
                  notes=notes)


def read_fallback_costs(path: Path) -> dict[str, Any]:
    """fallback_costs_here.json (experiments/precision_search/fallback_costs_here.py): one row per task and seed,
    the int8 IR's extra time with each part back in float (``float_part_extra.<part>``, a fraction) and the
    unchanged model's speed per runtime against PyTorch fp32 (``speed_vs_torch_fp32.<runtime>``)."""
    d = _json(path)
    rows = [{**r, "name": r["task"], "shape": f"{r['batch_size']} x {r['seq_len']}"} for r in d["rows"]]
    return legacy(path, source="experiments/precision_search/fallback_costs_here.py", config={"threads": d["threads"]},
                  rows=rows, machine=d["machine"])


def read_pick_rules(path: Path) -> dict[str, Any]:
    """replay*.json (experiments/pick_rules/replay.py): one row per pick rule, its picks' test figures on each half
    of the test split (``tuning``, ``report``) and on the whole of it, over the recorded runs."""
    d = _json(path)
    rows = [{**r, "name": r["rule"]} for r in d["rows"]]
    notes = [f"held-out figures that differ from compress's: {len(d['mismatches'])}"]
    return legacy(path, source="experiments/pick_rules/replay.py", config={"records": d["records"]}, rows=rows,
                  machine=d.get("machine"), notes=notes)


READERS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "head_prune": read_head_prune,
    "compress": read_compress,
    "openvino_export": read_openvino_export,
    "graph_speed": read_graph_speed,
    "refit": read_refit,
    "stock_interop": read_stock_interop,
    "families": read_families,
    "top1": read_top1,
    "suite": read_suite,
    "shrp": read_shrp,
    "doe": read_doe,
    "deploy": read_deploy,
    "demo": read_demo,
    "latency_prediction": read_latency_prediction,
    "st_runtimes": read_st_runtimes,
    "int8": read_int8,
    "embed": read_embed,
    "openvino_bf16": read_openvino_bf16,
    "recovery_tiers": read_recovery_tiers,
    "serving_shapes": read_serving_shapes,
    "fallback_costs": read_fallback_costs,
    "pick_rules": read_pick_rules,
}

__all__ = ["READERS", "ROOT", "legacy"]

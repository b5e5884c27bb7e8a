"""The one renderer of the results: every generated block of docs/results.md and the README, from JSON.

Each study under ``experiments/`` writes its raw measurements to ``experiments/<study>/results/``; this
script turns them into the text between a section's ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``
markers (one section per study), so no number in the page is typed by hand. Links in the page are made
relative to ``docs/``.

    python experiments/render_results.py [--demo out]
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surgery.measure.bench import BenchReport

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
EXPERIMENTS = ROOT / "experiments"


def results_dir(study: str) -> Path:
    """Where a study keeps its committed results."""
    return EXPERIMENTS / study / "results"


def relink(text: str, study: str) -> str:
    """Point a block's ``results/...`` links (written relative to the study) at the study's folder from docs/."""
    text = re.sub(r"\]\(results/", f"](../experiments/{study}/results/", text)
    return re.sub(r"`results/", f"`experiments/{study}/results/", text)


def _pct(x: float | None, scale: float = 100.0) -> str:
    return "-" if x is None else f"{x * scale:.1f}"


def _m(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _bench_rows(bench: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    models = {m["name"]: m for m in bench["models"]}
    comps = {c["name"]: c for c in bench["comparisons"]}
    return models, comps


def _settings(bench: dict[str, Any]) -> str:
    s = bench["settings"]
    where = f"on {s['machine']}, " if s.get("device", "cpu") != "cpu" else ""
    return (f"{where}batch {s['batch_size']} x {s['seq_len']} tokens, {s['repeats']} interleaved rounds after "
            f"{s['warmup']} warm-up, {s['threads']} thread(s), torch {s['torch_version']}, load average "
            f"{s['load_average_before']:.1f} before / {s['load_average_after']:.1f} after on {s['cpu_count']} CPUs")


SHRP_TARGETS = {3: (0.97, 1.8), 5: (0.90, 4.0)}  # issue 3: share of baseline accuracy, throughput ratio


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _shrp_key(name: str) -> tuple[int, str]:
    return int(name.split("-")[1]), name


def render_shrp(data: dict[str, Any]) -> str:
    setup = data["setup"]
    base = data["baseline"]
    models, comps = _bench_rows(data["bench"]) if "bench" in data else ({}, {})
    lines = [
        f"Raw numbers: [`results/shrp.json`](results/shrp.json), from `experiments/shrp/bench_shrp.py`. Setup: "
        f"MiniLM-L6 "
        f"fine-tuned on a seeded training subset of {setup['train_size']} Rotten Tomatoes snippets (stratified "
        f"split, seed {setup['split_seed']}, evaluation on all {setup['eval_size']} held-out snippets), max length "
        f"{setup['max_length']}, lr {setup['lr']}, baseline {setup['baseline_epochs']} epochs. SHRP starts from the "
        f"fine-tuned baseline and converts K layers, one per epoch, then {setup['extra_epochs']} extra epochs "
        f"(K + {setup['extra_epochs']} epochs in all). The pruning baselines start from the same fine-tuned model, "
        f"are cut to SHRP-K's parameter count without embeddings (gradient importance, Michel et al.) and then "
        f"fine-tuned for the epochs in the table: 1 (brief recovery) or as many as SHRP-K trained (`+matched`).",
        "",
        "| model | train epochs | accuracy | before pruning / recovery | % of baseline | params (w/o emb.) "
        "| GFLOPs / batch | samples/s | speedup (paired) | FLOP bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, epochs: int | str, acc: float, before: float | None, params: dict[str, int]) -> str:
        m, c = models.get(name), comps.get(name)
        flops = f"{m['flops_per_batch'] / 1e9:.1f}" if m else "-"
        thr = f"{m['throughput']:.1f}" if m else "-"
        sp = f"{c['speedup']:.2f}x ({c['paired_speedup']:.2f}x)" if c else ("1.00x" if m else "-")
        bound = f"{c['flop_bound_speedup']:.2f}x" if c else ("1.00x" if m else "-")
        return (f"| {name} | {epochs} | {_pct(acc)} | {_pct(before)} | {100 * acc / base['accuracy']:.1f}% | "
                f"{_m(params['total'])} ({_m(params['without_embeddings'])}) | {flops} | {thr} | {sp} | {bound} |")

    lines.append(row("baseline", setup["baseline_epochs"], base["accuracy"], None, base["params"]))
    shrp = sorted((k for k in data if k.startswith("shrp-")), key=_shrp_key)
    for name in shrp:
        r = data[name]
        lines.append(row(name, len(r["layers"]) + setup["extra_epochs"], r["accuracy_pruned"], r["accuracy_moe"],
                         r["params"]))
        k = _shrp_key(name)[0]
        if name != f"shrp-{k}-top-down":
            continue
        for key in sorted(x for x in data if "@" in x and x.split("@")[1] in (f"shrp-{k}", f"shrp-{k}+matched")):
            b = data[key]
            lines.append(row(key, b.get("recovery_epochs", "?"), b["accuracy"], b["accuracy_before_recovery"],
                             b["params"]))
    lines += ["", "\"before pruning / recovery\" is the MoE model (SHRP) or the pruned model before its "
                  "fine-tuning (baselines). `shrp-K-bottom-up` converts the lowest K layers; "
                  "`-expander-output` starts each Expander from the mean of the heads' output-projection slices "
                  "instead of at random; `-router-mean` routes on the masked mean of the layer input instead of "
                  "its [CLS] state.", ""]
    lines += ["**Targets (issue 3)**, throughput as the paired speedup over the baseline:", ""]
    for k, (acc_t, sp_t) in SHRP_TARGETS.items():
        name = f"shrp-{k}-top-down"
        if name not in data:
            lines.append(f"- {k} of 6 layers: not run")
            continue
        share = data[name]["accuracy_pruned"] / base["accuracy"]
        c = comps.get(name)
        speed = (f"throughput {c['paired_speedup']:.2f}x (target >= {sp_t}x: {_verdict(c['paired_speedup'] >= sp_t)}; "
                 f"FLOP bound {c['flop_bound_speedup']:.2f}x)") if c else "throughput not measured"
        lines.append(f"- {k} of 6 layers: accuracy {100 * share:.1f}% of baseline (target >= {100 * acc_t:.0f}%: "
                     f"{_verdict(share >= acc_t)}); {speed}")
        variants = [x for x in sorted(data) if x.startswith(name)]  # e.g. also ...-expander-output
        for key in sorted(x for x in data if "@" in x and x.split("@")[1] in (f"shrp-{k}", f"shrp-{k}+matched")):
            b, cb = data[key], comps.get(key)
            faster = f", paired speedup {cb['paired_speedup']:.2f}x" if cb else ""
            verdicts = "; ".join(f"{v} ({_pct(data[v]['accuracy_pruned'])}) more accurate: "
                                 f"{_verdict(data[v]['accuracy_pruned'] > b['accuracy'])}" for v in variants)
            lines.append(f"  - vs {key}: {_pct(b['accuracy'])}{faster}; {verdicts}")
    lines += ["", "Per-layer expert usage on the evaluation split (Top-1 keeps the most used expert):", ""]
    for name in shrp:
        usage = data[name].get("usage") or {}
        shown = "; ".join(f"layer {layer}: {u}" for layer, u in sorted(usage.items(), key=lambda t: int(t[0])))
        lines.append(f"- {name}: {shown}")
    if "bench" in data:
        lines += ["", f"Throughput: {_settings(data['bench'])}.", ""]
        lines += [f"- warning: {w}" for w in data["bench"].get("warnings", [])]
    return "\n".join(lines)


def render_doe(data: dict[str, Any]) -> str:
    setup = data["setup"]
    split = setup["split"]
    lines = [
        f"Raw numbers: [`results/doe.json`](results/doe.json) (status: {data.get('status')}), from "
        f"`experiments/doe/bench_doe.py`. Setup: MiniLM-L6, {setup['mode']}; seeded subset of "
        f"{split['train_size']} training "
        f"/ {split['eval_size']} evaluation snippets (stratified split seed {split['seed']}, max length "
        f"{split['max_length']}); {setup['prompt_length']} soft tokens, {setup['prompt_epochs']} prompt-tuning epochs, "
        f"attribution on {setup['attribution_instances']} instances, margin {setup['margin_points']} point, at most "
        f"{setup['max_probes']} probes with {setup['condense_epochs']} condensation epoch each.",
        "",
        "| model | accuracy | FFN neurons pruned | speedup (paired) | FLOP bound | share of bound |",
        "|---|---|---|---|---|---|",
    ]
    comps: dict[str, dict[str, Any]] = {}
    if "speed" in data:
        _, comps = _bench_rows(data["speed"])
    ft, pt, doe = data.get("fine_tuning", {}), data.get("prompt_tuning", {}), data.get("doe", {})

    def sp(name: str) -> tuple[str, str, str]:
        c = comps.get(name)
        if not c:
            return "-", "-", "-"
        return (f"{c['speedup']:.2f}x ({c['paired_speedup']:.2f}x)", f"{c['flop_bound_speedup']:.2f}x",
                f"{100 * c['fraction_of_flop_bound']:.0f}%")

    lines.append(f"| fine-tuned (all weights, {ft.get('epochs')} epoch(s)) | {ft.get('accuracy', 0):.1f} | 0% | "
                 + " | ".join(sp("fine-tuned")) + " |")
    lines.append(f"| prompt-tuned (reference) | {pt.get('accuracy', 0):.1f} | 0% | 1.00x | 1.00x | - |")
    if doe:
        lines.append(f"| DoE | {doe['accuracy']:.1f} | {100 * doe['pruning_rate']:.0f}% "
                     f"({doe['units_removed']}/{doe['units_total']}) | " + " | ".join(sp("doe")) + " |")
        probes = ", ".join(f"p={p['p']:.2f}: {p['accuracy']:.1f} ({'accepted' if p['accepted'] else 'rejected'})"
                           for p in doe["search"]["probes"])
        lines += ["", f"Binary search probes (accuracy after condensation): {probes}."]
    if "speed" in data:
        lines += ["", f"Speed is measured against the prompt-tuned model (both carry the 20 prompt tokens; the "
                      f"fine-tuned model has none): {_settings(data['speed'])}."]
    if "table4_condensation" in data:
        t4 = data["table4_condensation"]
        lines += ["", f"**Table 4 (condensation)** at p = {t4['pruning_rate']:.2f}: with "
                      f"{t4['with_condensation']:.1f}, without {t4['without_condensation']:.1f}."]
    if "figure5_importance_at_50pct" in data:
        f5 = data["figure5_importance_at_50pct"]
        cells = ", ".join(f"{k} {v['accuracy']:.1f} ({v['accuracy_before_condensation']:.1f} before condensation)"
                          for k, v in f5.items())
        lines += ["", f"**Figure 5 (importance at 50% of FFN neurons pruned, condensation epochs "
                      f"{setup.get('fig_condense_epochs', 1)})**: {cells}."]
    if "attribution_instances_at_50pct" in data:
        cells = ", ".join(f"{n} instances {v['accuracy']:.1f} ({v['accuracy_before_condensation']:.1f} before "
                          f"condensation)" for n, v in data["attribution_instances_at_50pct"].items())
        lines += ["", f"Attribution at 50% with more instances than the default 20 (same condensation): {cells}."]
    if "figure6_module_sets_at_30pct" in data:
        f6 = data["figure6_module_sets_at_30pct"]
        cells = "; ".join(f"{k}: accuracy {v['accuracy']:.1f}, speedup {v.get('speedup', float('nan')):.2f}x of a "
                          f"{v.get('flop_bound_speedup', float('nan')):.2f}x bound" for k, v in f6.items())
        lines += ["", f"**Figure 6 (module sets at 30% pruned)**: {cells}."]
    if "unplug_two_tasks" in data:
        u = data["unplug_two_tasks"]
        lat = ", ".join(f"{k} plug {v['plug_ms']:.1f} ms / restore {v['restore_ms']:.2f} ms"
                        for k, v in u["switch_latency_ms"].items())
        sizes = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sorted(u["expert_file_bytes"].items()))
        rvp = u["review_vs_plot_doe"]
        lines += ["", "**Unplug and play, two tasks in one runtime**: runtime accuracy "
                      + ", ".join(f"{k} {v:.1f}" for k, v in u["runtime_accuracy"].items())
                      + f"; review-vs-plot DoE pruned {100 * rvp['pruning_rate']:.0f}% "
                      f"(prompt-tuned {rvp['full_accuracy']:.1f} -> {rvp['accuracy']:.1f}); after reload "
                      f"{u['reloaded_review_vs_plot_accuracy']:.1f}; restore bit-identical: "
                      f"{u['restore_bit_identical']}; switch latency {lat}; full model "
                      f"{u['full_model_bytes'] / 1e6:.1f} MB once plus expert files {sizes}."]
    if "figures_rerun" in data:
        fr = data["figures_rerun"]
        lines += ["", f"Table 4 and Figures 5 and 6 come from a second invocation (`--figures-only`, same split and "
                      f"seed) that re-tuned the prompt-tuned full model: {fr['prompt_tuned_accuracy']:.1f} there "
                      f"against {pt.get('accuracy', 0):.1f} in the main run. Why: {fr.get('why', '-')}."]
    lines += ["", "**Targets (issue 4)**:", ""]
    if doe:
        drop = pt["accuracy"] - doe["accuracy"]
        lines.append(f"- accuracy within 1 point of prompt tuning at >= 50% of FFN neurons pruned: "
                     f"{drop:+.1f} points at {100 * doe['pruning_rate']:.0f}% pruned "
                     f"({_verdict(drop <= 1.0 and doe['pruning_rate'] >= 0.5)})")
    if comps.get("doe"):
        c = comps["doe"]
        lines.append(f"- speedup >= 90% of the FLOP bound: {c['speedup']:.2f}x of {c['flop_bound_speedup']:.2f}x = "
                     f"{100 * c['fraction_of_flop_bound']:.0f}% ({_verdict(c['fraction_of_flop_bound'] >= 0.9)})")
    if "figure5_importance_at_50pct" in data:
        f5 = data["figure5_importance_at_50pct"]
        best_other = max(v["accuracy"] for k, v in f5.items() if k != "attribution")
        lines.append(f"- attribution beats activation, gradient and random at 50%: {f5['attribution']['accuracy']:.1f} "
                     f"against at best {best_other:.1f} ({_verdict(f5['attribution']['accuracy'] > best_other)})")
    return "\n".join(lines)


FAMILY_ORDER = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "deberta-v2", "modernbert")
FAMILY_METHODS = ("head+ffn 0.5", "shrp half", "doe ffn 0.65")
SHARE_TARGET, HALF_WIDTH_TARGET = 0.90, 0.05  # issue 13


def render_families(data: dict[str, Any]) -> str:
    measured = data.get("families", {})
    lines = [
        "Raw numbers: [`results/families.json`](results/families.json), from "
        "`experiments/families/bench_families.py` (one "
        "family per invocation, merged). Each cell: paired speedup [95% bootstrap interval over rounds] / FLOP "
        "bound = share of the bound (paired speedup / bound).",
        "",
        "| family (size of) | layers | attention | GFLOPs / batch | " + " | ".join(FAMILY_METHODS)
        + " | batch, rounds | load avg. | date |",
        "|---|---|---|---|" + "---|" * len(FAMILY_METHODS) + "---|---|---|",
    ]
    misses, wide = [], []
    for family in FAMILY_ORDER:
        entry = measured.get(family)
        if entry is None:
            lines.append(f"| {family} | - | - | - | " + " | ".join("not yet timed" for _ in FAMILY_METHODS)
                         + " | - | - | - |")
            continue
        cells = []
        for method in FAMILY_METHODS:
            m = entry["methods"][method]
            cells.append(f"{m['paired_speedup']:.2f}x [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}] / "
                         f"{m['flop_bound_speedup']:.2f}x = **{100 * m['share_of_bound']:.0f}%**")
            if m["share_of_bound"] < SHARE_TARGET:
                misses.append(f"{family} {method} ({100 * m['share_of_bound']:.0f}%)")
            if m["half_width"] > HALF_WIDTH_TARGET:
                wide.append(f"{family} {method} (+-{100 * m['half_width']:.1f}%)")
        s = entry["settings"][0]
        loads = "/".join(f"{x:.1f}" for x in entry["shared_machine_load"] if x is not None)
        rounds = sum(st["repeats"] for st in entry["settings"])
        vocab = "" if entry["vocab_size"] == entry["real_vocab_size"] else (
            f", vocab {entry['vocab_size']:,} for {entry['real_vocab_size']:,}")
        lines.append(f"| {family} ({entry['checkpoint_size_of']}{vocab}) | {entry['layers']} | {entry['attention']} | "
                     f"{entry['original']['flops_per_batch'] / 1e9:.0f} | " + " | ".join(cells)
                     + f" | {s['batch_size']}x{s['seq_len']}, {rounds} | {loads} | {entry['date']} |")
    done = [measured[f] for f in FAMILY_ORDER if f in measured]
    if done:
        s = done[0]["settings"][0]
        lines += ["", f"Batch {s['batch_size']} x {s['seq_len']} tokens, {s['threads']} thread(s), torch "
                      f"{s['torch_version']}, on {s['cpu_count']} CPUs shared with other jobs (load averages: before "
                      "each block of rounds and after the last)."]
    explained = [_profile_line(measured[f], method) for f in FAMILY_ORDER if f in measured
                 for method in FAMILY_METHODS if measured[f]["methods"][method]["share_of_bound"] < SHARE_TARGET]
    if any(explained):
        lines += ["", "**Profiles of the misses** (`torch.profiler`, one forward each, self CPU time; matmul = "
                      "the operators that do the counted FLOPs, other = softmax, GELU, LayerNorm, copies, masks, "
                      "which the FLOP bound leaves out):", "", *[e for e in explained if e]]
    lines += ["", "**Targets (issue 13)**:", "",
              f"- share of the FLOP bound >= {SHARE_TARGET:.0%} for every family x method: "
              + (f"missed by {', '.join(misses)}" if misses else "met by every measured cell")
              + f" ({len(done)} of {len(FAMILY_ORDER)} families measured)",
              f"- every interval within +-{HALF_WIDTH_TARGET:.0%}: "
              + (f"wider for {', '.join(wide)}" if wide else "met by every measured cell")]
    return "\n".join(lines)


def _profile_line(entry: dict[str, Any], method: str) -> str | None:
    profiles = entry.get("profiles") or {}
    base, cut = profiles.get("original"), profiles.get(method)
    if not base or not cut:
        return None

    def other(p: dict[str, Any]) -> float:
        return p["total_ms"] - p["matmul_ms"]

    top = ", ".join(f"{o['op']} {o['ms']:.0f} ms" for o in cut["ops"][:4])
    m = entry["methods"][method]
    share = f"share {100 * m['share_of_bound']:.0f}% [{100 * m['share_ci95'][0]:.0f}, {100 * m['share_ci95'][1]:.0f}]"
    return (f"- {entry['family']} {method} ({share}; the profiled forwards give "
            f"{base['total_ms'] / cut['total_ms']:.2f}x of a {m['flop_bound_speedup']:.2f}x bound): "
            f"matmul {base['matmul_ms']:.0f} -> {cut['matmul_ms']:.0f} ms "
            f"({base['matmul_ms'] / max(cut['matmul_ms'], 1e-9):.2f}x), other {other(base):.0f} -> {other(cut):.0f} ms "
            f"({other(base) / max(other(cut), 1e-9):.2f}x), total {base['total_ms']:.0f} -> {cut['total_ms']:.0f} ms; "
            f"other is {other(cut) / cut['total_ms']:.0%} of the surgery's time. Top operators: {top}.")


def _ms(cell: list[float] | None, digits: int = 1) -> str:
    return "-" if cell is None else f"{cell[0]:.{digits}f} ± {cell[1]:.{digits}f}"


TOP1_VARIANTS = ("today", "today+recover", "entropy", "drop", "drop+entropy")


def render_top1(data: dict[str, Any]) -> str:
    """The Top-1 mechanism comparison (experiments/top1_mechanisms/compare_top1.py): per task and variant.

    Mean ± std over seeds.
    """
    cells = data.get("summary", {})
    runs = list(data["runs"].values())
    sizes = sorted({(r["task"], r["data"]["train_size"], r["data"]["dev_size"], r["data"]["test_size"]) for r in runs})
    lines = [
        "Raw numbers: [`results/top1_mechanisms.json`](results/top1_mechanisms.json), from "
        "`experiments/top1_mechanisms/compare_top1.py`. MiniLM-L6, the README recipe (`num_layers=3`, "
        "`finetune_epochs=1`, lr 1e-4, "
        "`extra_epochs=2`); stages 0-1 are trained once per (task, seed) and every variant runs stage 2 (and after) "
        "from a copy of that model. Splits (seeded, stratified; train/dev/test): "
        + "; ".join(f"{t} {a}/{b}/{c}" for t, a, b, c in sizes)
        + ". The cut's usage calibration reads dev; accuracies below are on test, in points, mean ± std over "
        "the seeds listed. *cut loss*: routed model before the cut minus the model after it (positive = lost); "
        "*final vs today's routed*: the routed model of `today` (same task and seed) minus what the variant hands "
        "back (after recovery for `today+recover`).",
        "",
        "| task | variant | seeds | test accuracy (final) | routed before the cut | cut loss | worst cut loss "
        "| final vs today's routed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {v: i for i, v in enumerate(TOP1_VARIANTS)}
    for cell in sorted(cells.values(), key=lambda c: (c["task"], order.get(c["variant"], 99))):
        lines.append(f"| {cell['task']} | {cell['variant']} | {','.join(map(str, cell['seeds']))} | "
                     f"{_ms(cell['test_final'])} | {_ms(cell['test_routed'])} | {_ms(cell['cut_loss'])} | "
                     f"{cell['cut_loss_max']:.1f} | {_ms(cell['loss_vs_today_routed'])} |")
    by_variant: dict[str, list[float]] = {}
    for cell in cells.values():
        by_variant.setdefault(cell["variant"], []).append(cell["cut_loss"][0])
    lines += ["", "Mean cut loss over tasks: " + "; ".join(
        f"`{v}` {sum(x) / len(x):.2f}" for v, x in sorted(by_variant.items(), key=lambda kv: order.get(kv[0], 99)))
        + " points."]
    return "\n".join(lines)


def render_suite(data: dict[str, Any], name: str = "suite") -> str:
    """The multi-task, multi-seed suite (experiments/suite/bench_suite.py), from ``results/NAME.json``."""
    if "suite" not in data:
        return (f"Not summarised yet: run `python experiments/suite/bench_suite.py --steps render --out "
                f"experiments/suite/results/{name}.json`.")
    suite = data["suite"]
    bench = data.get("bench")
    runs = list(data["runs"].values())
    trained = sorted({r.get("device", "cpu") for r in runs})
    sizes = sorted({r["data"]["train_size"] for r in runs})
    lines = [
        f"Raw numbers: [`results/{name}.json`](results/{name}.json), from `experiments/suite/bench_suite.py`; plots "
        f"[`results/{name}_pareto.png`](results/{name}_pareto.png) and [`results/{name}_usage.png`]"
        f"(results/{name}_usage.png). Trained on {', '.join(trained)}, with {'/'.join(map(str, sizes))} training "
        "examples per task and seed. Test accuracy in points, mean ± std over the seeds listed; *retained*: "
        "test accuracy as % of the fine-tuned model of the same task and seed. Speedup: measured side by side "
        "against the fine-tuned model"
        + (f" (models of {bench['task']} seed {bench['seed']}; {_settings(bench['report'])})" if bench else
           " (not measured in this run)") + ".",
        "",
        "| task | method | seeds | test accuracy | retained % | dev cut loss (SHRP) | params w/o emb. | speedup "
        "| FLOP bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in suite["table"]:
        sp = "-" if c["speedup"] is None else f"{c['speedup']:.2f}x"
        fb = "-" if c["flop_bound_speedup"] is None else f"{c['flop_bound_speedup']:.2f}x"
        lines.append(f"| {c['task']} | {c['method']} | {','.join(map(str, c['seeds']))} | {_ms(c['test'])} | "
                     f"{_ms(c['retained'])} | {_ms(c['cut_loss_dev'])} | {_m(c['params_without_embeddings'])} | "
                     f"{sp} | {fb} |")
    if suite.get("paired"):
        lines += ["", "Variants against their base method, seed by seed (accuracy points, variant minus base, mean ± "
                  "std; dev decides, test reports; *dev wins*: seeds where the variant is ahead on dev):", "",
                  "| task | variant | base | seeds | dev Δ | test Δ | dev wins |", "|---|---|---|---|---|---|---|"]
        for c in suite["paired"]:
            lines.append(f"| {c['task']} | {c['method']} | {c['base']} | {','.join(map(str, c['seeds']))} | "
                         f"{_signed(c['dev'])} | {_signed(c['test'])} | {c['dev_wins']}/{len(c['seeds'])} |")
    return "\n".join(lines)


def _signed(cell: list[float]) -> str:
    return f"{cell[0]:+.1f} ± {cell[1]:.1f}"


#: Tables that study scripts write as markdown beside their JSON, each shown under its own heading (the
#: files share a title, so the file's title gives way to what tells the runs apart), and a plot after them.
INCLUDED_TABLES: dict[str, list[tuple[str, str]]] = {
    "latency_prediction": [
        ("results-torch", "PyTorch fp32, one thread: MiniLM-L6 and a 12-layer model at BERT-base widths"),
        ("results-int8", "ONNX Runtime int8 (smoothed), MiniLM-L6, against the int8 original and PyTorch fp32"),
    ],
    "compress": [("compress", "surgery compress on fine-tuned MiniLM-L6 classifiers, test accuracy retained")],
    "st_runtimes": [("st_runtimes", "all-MiniLM-L6-v2: surgery's int8 against sentence-transformers' ONNX and "
                     "OpenVINO exports")],
    "int8": [
        ("int8_smoothing", "Choosing the alpha: seeds 0-2, probes on 600 / 300 texts"),
        ("int8_smoothing_probes", "The same seeds with larger probe sets"),
        ("int8_smoothing_fresh", "Held-out seeds 3-5, which chose nothing"),
    ],
    "embeddings": [
        ("embed_16k_seeds", "16,000 training texts, three seeds, on a GPU"),
        ("embed_4k_smooth", "4,000 training texts on the CPU, int8 with smoothed activations"),
        ("embed_4k_int8", "4,000 training texts on the CPU, a structural cut composed with int8"),
    ],
}
INCLUDED_PLOTS = {"embeddings": ("embed_4k_int8_pareto.png",
                                 "recall@10 against measured speedup, PyTorch fp32 and ONNX Runtime int8")}


def render_tables(study: str) -> str:
    """A study's committed tables: the file's title becomes this page's heading, its sub-headings bold lines."""
    parts = []
    for name, title in INCLUDED_TABLES[study]:
        path = results_dir(study) / f"{name}.md"
        if not path.exists():
            continue
        text = re.sub(r"^#{2,} (.*)$", r"**\1**", path.read_text().strip(), flags=re.M)
        text = re.sub(r"^# .*$", f"### {title}", text, count=1, flags=re.M)
        text = re.sub(r"\]\(([^/)#:]+)\)", r"](results/\1)", text)  # a sibling file of the table
        parts.append(f"{text}\n\nSource: [results/{name}.md](results/{name}.md).")
    if study in INCLUDED_PLOTS and (results_dir(study) / INCLUDED_PLOTS[study][0]).exists():
        plot, caption = INCLUDED_PLOTS[study]
        parts.append(f"![{caption}](results/{plot})")
    return "\n\n".join(parts)


#: What the README's main command builds, so the variant its before/after table shows.
README_VARIANT = "head-prune 0.5"


def _bench_report(result: dict[str, Any]) -> BenchReport:
    from surgery.measure.bench import BenchReport  # torch: only when this section is rendered

    return BenchReport.model_validate(result["bench"])


def _head_prune_table(report: BenchReport, anatomy: dict[str, Any], fidelity: dict[str, Any]) -> str:
    """The markdown table of the results."""
    rows = ["| model | heads | FFN width | params (w/o emb.) | GFLOPs / batch | samples/s | latency p50 / p95 ms "
            "| speedup | paired speedup [IQR] | FLOP-bound speedup | realised | peak MB | embedding cosine |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {c.name: c for c in report.comparisons}
    for m in report.models:
        c = ratios.get(m.name)
        shape = anatomy[m.name]
        cos = fidelity["cosine"].get(m.name)
        rows.append(
            f"| {m.name} | {sum(shape['heads'])} | {sum(shape['ffn_width'])} "
            f"| {m.params.total / 1e6:.2f}M ({m.params.without_embeddings / 1e6:.2f}M) "
            f"| {m.flops_per_batch / 1e9:.1f} | {m.throughput:.1f} | {m.latency_p50_ms:.0f} / {m.latency_p95_ms:.0f} "
            + (f"| {c.speedup:.2f}x | {c.paired_speedup:.2f}x [{c.paired_speedup_iqr[0]:.2f}, "
               f"{c.paired_speedup_iqr[1]:.2f}] | {c.flop_bound_speedup:.2f}x | {c.fraction_of_flop_bound:.0%} " if c
               else "| 1.00x | - | 1.00x | - ")
            + f"| {m.peak_memory_bytes / 2**20:.0f} | "
            + (f"{cos['mean']:.3f} (min {cos['min']:.3f}) |" if cos else "1 |")
        )
    return "\n".join(rows)


def render_head_prune(result: dict[str, Any]) -> str:
    """The head-prune section, from the JSON of experiments/head_prune/bench_head_prune.py."""
    report = _bench_report(result)
    s = report.settings
    loads = f"{s.load_average_before:.1f} before, {s.load_average_after:.1f} after" if s.load_average_before else "n/a"
    lines = [
        f"Generated by `python {result['command']}` at commit `{result['git']['commit'][:10]}` "
        f"on {result['date']} ({result['seconds']:.0f} s); raw numbers in "
        "[`results/head_prune.json`](results/head_prune.json).",
        "",
        f"Setup: all-MiniLM-L6-v2 (`minilm-l6`), {s.device}, torch {s.torch_version}, {s.threads} thread(s), "
        f"batch {s.batch_size} x {s.seq_len} tokens (no padding), {s.warmup} warm-up + {s.repeats} timed rounds, "
        f"interleaved with rotating order in one process. Machine: {s.cpu_count} CPUs shared with other jobs "
        f"(1-minute load average {loads}), so absolute throughput is lower than on an idle machine and varies "
        "between rounds; the ratios are the figures to read, the paired speedup (median of same-round ratios) "
        "most of all. \"Realised\" is the speedup as a fraction of the FLOP bound; it can exceed 100% because "
        "element-wise work (softmax, GELU), which the FLOP count leaves out, shrinks too. "
        "Variants are pruned by weight magnitude (no data) and **not fine-tuned**; "
        f"embedding cosine is the mean cosine similarity of mean-pooled sentence embeddings to the original on "
        f"{result['fidelity']['snippets']} Rotten Tomatoes snippets (1 = unchanged output).",
        "",
        _head_prune_table(report, result["anatomy"], result["fidelity"]),
        "",
    ]
    if report.warnings:
        lines += ["Warnings from the benchmark:", ""] + [f"- {w}" for w in report.warnings] + [""]
    return "\n".join(lines)


def render_readme_bench(result: dict[str, Any]) -> str:
    """The before/after table the README shows for its main command (original vs head-prune 0.5)."""
    report = _bench_report(result)
    before, after = report.model("original"), report.model(README_VARIANT)
    c = next(c for c in report.comparisons if c.name == README_VARIANT)
    rows = ["| | params (w/o emb.) | GFLOPs / batch | samples/s | latency p50 ms | peak MB |",
            "|---|---|---|---|---|---|"]
    for label, m in (("before: minilm-l6", before), (f"after: {README_VARIANT}", after)):
        rows.append(f"| {label} | {m.params.total / 1e6:.2f}M ({m.params.without_embeddings / 1e6:.2f}M) "
                    f"| {m.flops_per_batch / 1e9:.1f} | {m.throughput:.1f} | {m.latency_p50_ms:.0f} "
                    f"| {m.peak_memory_bytes / 2**20:.0f} |")
    s = report.settings
    return "\n".join([
        *rows, "",
        f"Speedup {c.speedup:.2f}x (paired per round: {c.paired_speedup:.2f}x, quartiles "
        f"{c.paired_speedup_iqr[0]:.2f}-{c.paired_speedup_iqr[1]:.2f}) against a FLOP bound of "
        f"{c.flop_bound_speedup:.2f}x; batch {s.batch_size} x {s.seq_len}, {s.threads} thread on a shared "
        f"{s.cpu_count}-CPU machine. Measured by `experiments/head_prune/bench_head_prune.py`, which builds the "
        f"same model through "
        "the Python API; all variants and the method are in [docs/results.md](docs/results.md).",
    ])


def render_deploy(data: dict[str, Any]) -> str:
    """The markdown between the ``deploy`` markers of docs/results.md."""
    bench, head, s = data["bench"], data["headline"], data["bench"]["settings"]
    trained = data["setup"].get("trained", True)
    comps = {c["name"]: c for c in bench["comparisons"]}
    lines = [
        f"Generated by `python experiments/deploy/bench_deploy.py` at commit `{data['generated']['commit']}` on "
        f"{data['generated']['date']}; raw numbers in [`results/deploy.json`](results/deploy.json).",
        "",
        f"Setup: all-MiniLM-L6-v2 (`minilm-l6`) and the README's SHRP recipe (3 of 6 layers single-head, "
        f"`{data['setup']['shrp']}`), batch {s['batch_size']} x {s['seq_len']} tokens, {s['threads']} thread(s) for "
        f"torch and ONNX Runtime alike, {s['repeats']} interleaved rounds after {s['warmup']} warm-up in one process, "
        f"torch {s['torch_version']}; load average {s['load_average_before']:.1f} before / "
        f"{s['load_average_after']:.1f} after on {s['cpu_count']} shared CPUs. "
        + (f"Accuracy on the {data['setup']['eval_size']} held-out Rotten Tomatoes snippets (the original encoder "
           "has no trained head, so no accuracy). " if trained else "**Speed only**: the SHRP row is the recipe's "
           "structure (top 3 layers Expert Attention, Top-1 pruned) without its training, which has the same "
           "shapes and operators as the trained model; accuracy is not reported. ")
        # Exports before int8_per_channel was recorded were per tensor (the only granularity then).
        + "int8 = ONNX Runtime dynamic quantization (int8 weights with one scale per "
        + ("output channel" if data["export"].get("int8_per_channel") else "tensor")
        + ", per-batch activation scales). Size = ONNX file or torch parameter bytes.",
        "",
        "| model | runtime | samples/s | latency p50 / p95 ms | speedup (paired [IQR]) | size MB | accuracy % |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in bench["models"]:
        c = comps.get(m["name"])
        speed = "1.00x" if c is None else (f"{c['paired_speedup']:.2f}x [{c['paired_speedup_iqr'][0]:.2f}, "
                                           f"{c['paired_speedup_iqr'][1]:.2f}]")
        acc = "-" if m["accuracy"] is None or not trained else f"{100 * m['accuracy']:.1f}"
        name, runtime = m["name"].split(" [")
        lines.append(f"| {name} | {runtime.rstrip(']')} | {m['throughput']:.1f} | {m['latency_p50_ms']:.0f} / "
                     f"{m['latency_p95_ms']:.0f} | {speed} | {m['weights_bytes'] / 1e6:.1f} | {acc} |")
    t, base = data["targets"], data["bert_base_export"]
    fp32, int8, share = head["speedup_vs_original_fp32"], head["speedup_vs_original_int8"], head["accuracy_share"]
    seconds, drift = base["export_seconds"], data["export"]["int8_drift"]
    fp32_ok, int8_ok = fp32["median"] >= t["speedup_vs_original_fp32"], int8["median"] >= t["speedup_vs_original_int8"]
    share_cell = (f"{share:.1%} | {_verdict(share >= t['accuracy_share'])}" if trained else
                  "not measured: this run used SHRP's structure without its training (`--standin`) |")
    lines += [
        "",
        "| target (issue 9) | reached | |",
        "|---|---|---|",
        f"| SHRP int8 in ORT vs original fp32 PyTorch, >= {t['speedup_vs_original_fp32']}x | {fp32['median']:.2f}x "
        f"(paired, IQR {fp32['q1']:.2f}-{fp32['q3']:.2f}) | {_verdict(fp32_ok)} |",
        f"| ... at >= {t['accuracy_share']:.0%} of the fp32 PyTorch SHRP accuracy | {share_cell} |",
        f"| SHRP int8 vs original int8 (both ORT), >= {t['speedup_vs_original_int8']}x | {int8['median']:.2f}x (IQR "
        f"{int8['q1']:.2f}-{int8['q3']:.2f}) | {_verdict(int8_ok)} |",
        f"| export of a bert-base-sized model ({base['params'] / 1e6:.0f}M parameters) < "
        f"{t['bert_base_export_seconds']:.0f} s | {seconds:.0f} s (with the parity check "
        f"{base['total_seconds_with_parity']:.0f} s) | {_verdict(seconds < t['bert_base_export_seconds'])} |",
        "",
        f"The SHRP export itself: fp32 parity {data['export']['parity']['max_abs_diff']:.1e} (max abs), int8 drift "
        f"{drift['max_abs_diff']:.2e} (min cosine {drift['min_cosine']:.4f}).",
    ]
    ops = data["export"].get("optimized") or {}
    if ops:
        lines += ["", "Operators of that graph after `--optimize` (ONNX Runtime, extended level): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])) + "."]
    if bench["warnings"]:
        lines += ["", "Warnings from the benchmark:", ""] + [f"- {w}" for w in bench["warnings"]]
    return "\n".join(lines) + "\n"



def replace_section(page: str, name: str, body: str, where: str = "docs/results.md") -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body}\n{end}"
    if begin in page:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, page, flags=re.S)
    raise SystemExit(f"{where} has no {begin} marker; add the markers to its section first")


def collect_demo(out_dir: Path) -> dict[str, Any]:
    """The README demo's outputs (``scripts/demo.sh`` writes them under ``out/``) as one record."""
    import subprocess

    files = {"report": out_dir / "minilm-shrp-report.json", "bench": out_dir / "minilm-shrp-bench.json"}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found; run `bash scripts/demo.sh` first")
    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"command": "bash scripts/demo.sh", "commit": commit,
            **{k: json.loads(p.read_text()) for k, p in files.items()}}


def render_demo(data: dict[str, Any]) -> str:
    """The README's before/after table of the SHRP demo."""
    report, bench = data["report"], data["bench"]
    m = report["metrics"]
    history = m["history"]
    tuned = next((h["eval_acc"] for h in history if h.get("stage") == 0), None)
    models = {x["name"]: x for x in bench["models"]}
    c = bench["comparisons"][0]
    ref, new = models[c["reference"]], models[c["name"]]
    conv = report["config"].get("num_layers") or len(m.get("layers", []))

    def line(label: str, model: dict[str, Any], acc: float | None) -> str:
        p = model["params"]
        return (f"| {label} | {_m(p['total'])} ({_m(p['without_embeddings'])}) | "
                f"{model['flops_per_batch'] / 1e9:.1f} | {model['throughput']:.1f} | {model['latency_p50_ms']:.0f} | "
                f"{_pct(acc)} |")

    s = bench["settings"]
    return "\n".join([
        "| | params (w/o emb.) | GFLOPs / batch | samples/s | latency p50 ms | accuracy % |",
        "|---|---|---|---|---|---|",
        line("before: minilm-l6, fine-tuned 1 epoch (stage 0)", ref, tuned),
        line(f"after: SHRP, {conv} of 6 layers single-head", new, m["accuracy_pruned"]),
        "",
        f"Speedup {c['speedup']:.2f}x (paired per round: {c['paired_speedup']:.2f}x) against a FLOP bound of "
        f"{c['flop_bound_speedup']:.2f}x; batch {s['batch_size']} x {s['seq_len']}, {s['threads']} thread(s), "
        f"{s['repeats']} interleaved rounds. Accuracy on the {m['data']['eval_size']} held-out snippets (seeded "
        f"stratified split); the routed (MoE) model before pruning scored {_pct(m['accuracy_moe'])}, and the "
        f"fine-tuned row's accuracy is that of the same model after its stage-0 epoch, before any conversion "
        f"(the bench row is the original encoder, whose new classifier head is not trained). "
        f"Rendered by `python experiments/render_results.py --demo out` from the demo's own JSON output at commit "
        f"`{data['commit']}`; raw numbers in "
        f"[experiments/shrp/results/demo_shrp.json](experiments/shrp/results/demo_shrp.json).",
    ])


def render_readme_compress(table: str) -> str:
    """The README's compress block: the per-target summary of ``compress.md`` and the machine it ran on."""
    blocks = table.strip().split("\n\n")
    summary = blocks[0]
    # The embedding targets: their heading and table, when the study has run them.
    at = next((i for i, b in enumerate(blocks) if b.startswith("Embeddings (")), None)
    embedding = "\n\n".join(blocks[at:at + 2]) if at is not None else ""
    machine = next((line for line in table.splitlines() if line.startswith("Machine:")), "")
    return "\n\n".join(part for part in (
        summary, embedding, machine, "Rendered by `python experiments/render_results.py` from "
        "[experiments/compress/results/compress.json](experiments/compress/results/compress.json); per run, "
        "the winner and every candidate: "
        "[docs/results.md](docs/results.md#target-driven-compression-surgery-compress).")
        if part)


#: (marker, study, JSON file, renderer) for every generated block of docs/results.md, in page order.
SECTIONS: list[tuple[str, str, str | None, Callable[..., str]]] = [
    ("head-prune", "head_prune", "head_prune.json", render_head_prune),
    ("shrp", "shrp", "shrp.json", render_shrp),
    ("doe", "doe", "doe.json", render_doe),
    ("families", "families", "families.json", render_families),
    ("deploy", "deploy", "deploy.json", render_deploy),
    ("int8_smoothing", "int8", None, functools.partial(render_tables, "int8")),
    ("top1_mechanisms", "top1_mechanisms", "top1_mechanisms.json", render_top1),
    *((name, "suite", f"{name}.json", functools.partial(render_suite, name=name))
      for name in ("suite", "suite_gpu", "suite_gpu_5k")),
    ("embeddings", "embeddings", None, functools.partial(render_tables, "embeddings")),
    ("latency_prediction", "latency_prediction", None, functools.partial(render_tables, "latency_prediction")),
    ("compress", "compress", None, functools.partial(render_tables, "compress")),
    ("st_runtimes", "st_runtimes", None, functools.partial(render_tables, "st_runtimes")),
]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Render docs/results.md and the README's tables from the JSON.")
    parser.add_argument("--demo", type=Path, help="the out/ directory of a `bash scripts/demo.sh` run to record")
    args = parser.parse_args()
    page = PAGE.read_text()
    for marker, study, name, render in SECTIONS:
        if name is None:
            page = replace_section(page, marker, relink(render(), study))
        elif (results_dir(study) / name).exists():
            data = json.loads((results_dir(study) / name).read_text())
            page = replace_section(page, marker, relink(render(data), study))
    PAGE.write_text(page)
    readme = README.read_text()
    bench_file = results_dir("head_prune") / "head_prune.json"
    if bench_file.exists():
        readme = replace_section(readme, "readme-bench", render_readme_bench(json.loads(bench_file.read_text())),
                                 where="README.md")
    compress_table = results_dir("compress") / "compress.md"
    if compress_table.exists():
        readme = replace_section(readme, "readme-compress", render_readme_compress(compress_table.read_text()),
                                 where="README.md")
    demo_file = results_dir("shrp") / "demo_shrp.json"
    if args.demo is not None:
        demo_file.write_text(json.dumps(collect_demo(args.demo), indent=2) + "\n")
    if demo_file.exists():
        readme = replace_section(readme, "readme-demo", render_demo(json.loads(demo_file.read_text())),
                                 where="README.md")
    README.write_text(readme)


if __name__ == "__main__":
    main()

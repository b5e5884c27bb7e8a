"""The cost target: `surgery compress` on BERT-base (or -large) widths, estimate against actual per phase.

The model: a BERT config at base widths (12 layers x 768, 12 heads, FFN 3072) or, with ``--size large``,
at large widths (24 layers x 1024, 16 heads, FFN 4096); random weights, seed 0;
with all-MiniLM-L6-v2's tokenizer (the embedded ``minilm-l6``; the same WordPiece vocabulary as BERT's
uncased one). The data: real texts, Rotten Tomatoes snippets (the embedded ``rotten-tomatoes``)
joined six at a time so that most exceed 128 tokens, 2,000 texts. The job, through the command a user
runs (a subprocess, logged to disk), on the embedding objective (random weights have no task)::

    surgery compress MODEL --data corpus.txt --objective embedding --max-length 128 \\
        --speedup 8 --runtime openvino-int8 --out OUT

with a fresh latency cache. Recorded beside the result: ``lscpu``'s model and flags, the load
average every 30 s while it ran, wall time, the up-front estimate against each phase's actual time
(``compress.json``'s ``estimate``) and the peak RSS (``peak_rss_bytes``, and /usr/bin/time's when present).

Run from the repository root::

    nohup nice python experiments/compress_cost/run_cost.py --work /tmp/cost/work > /tmp/cost/run.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "compress_cost" / "results"
TEXTS, JOIN = 2000, 6
#: BERT's published widths: layers, hidden size, heads, FFN width.
SIZES = {"base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}


def build_inputs(work: Path, size: str = "base", join: int = JOIN) -> tuple[Path, Path]:
    """The random-weight BERT directory at ``size``'s widths (MiniLM's tokenizer) and the corpus file, made once.

    Each text joins ``join`` snippets (about 35 tokens each: 6 reach 128 tokens, 18 reach 512), taken in
    turn and wrapped around the table where 2,000 texts need more snippets than it holds."""
    import pandas as pd
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from surgery.persist.assets import resolve_data_path, resolve_model_path

    model_dir = work / f"bert-{size}-random"
    corpus = work / ("corpus.txt" if join == JOIN else f"corpus-join{join}.txt")
    if not (model_dir / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
        torch.manual_seed(0)
        layers, hidden, heads, ffn = SIZES[size]
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512)
        BertModel(config).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    if not corpus.is_file():
        table = pd.read_csv(resolve_data_path("rotten-tomatoes"))
        snippets = [" ".join(str(t).split()) for t in table[table.category != "plot"].text.tolist()]
        texts = [" ".join(snippets[k % len(snippets)] for k in range(i, i + join))
                 for i in range(0, join * TEXTS, join)]
        corpus.write_text("\n".join(texts) + "\n")
    return model_dir, corpus


def cpu_facts() -> dict[str, object]:
    """lscpu's model name, cores and flags."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k: fields.get(k, "").strip() for k in ("Model name", "CPU(s)", "Thread(s) per core", "Flags")}


def snapshot(work: Path, name: str) -> None:
    """What an unfinished run reached: its progress lines (the plan printed before the work included), the
    process's CPU time and RSS now, the load average; written to results/<name>.partial.json."""
    log = (work / f"{name}.stderr.log").read_text().replace("\r", "\n")
    lines = [line for line in log.splitlines() if line.strip() and not any(
        skip in line for skip in ("Writing", "Loading", "it/s]", "━"))]
    ps = subprocess.run(["ps", "-eo", "pid,etime,time,rss,args"], capture_output=True, text=True, check=False).stdout
    process = [row.split(None, 4)[:4] for row in ps.splitlines()
               if "bin/surgery compress" in row and "time -v" not in row]
    watch = work / "watch.log"
    result = {"finished": False, "cpu": cpu_facts(), "load_average_now": os.getloadavg(),
              "progress_lines": lines, "process_pid_elapsed_cputime_rss_kib": process,
              "progress_seen_every_10s": watch.read_text().splitlines() if watch.is_file() else []}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.partial.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("load_average_now", "process_pid_elapsed_cputime_rss_kib")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--size", choices=sorted(SIZES), default="base", help="BERT's base or large widths")
    parser.add_argument("--join", type=int, default=JOIN, help="snippets per text (18 for texts past 512 tokens)")
    parser.add_argument("--name", default="bert_base_128")
    parser.add_argument("--budget", type=float, default=None,
                        help="minutes for the whole job (compress --budget): its phases scale down to fit")
    parser.add_argument("--snapshot", action="store_true", help="write what a running (unfinished) run reached")
    args = parser.parse_args()
    if args.snapshot:
        snapshot(args.work, args.name)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir, corpus = build_inputs(args.work, args.size, args.join)
    out = args.work / f"out-{args.name}"
    env = {**os.environ, "SURGERY_CACHE": str(args.work / f"cache-{args.name}")}  # fresh: the table is measured
    command = ["surgery", "compress", str(model_dir), "--data", str(corpus), "--objective", "embedding",
               "--max-length", str(args.seq_len), "--speedup", "8", "--runtime", "openvino-int8",
               "--out", str(out), "--overwrite", *(["--budget", f"{args.budget:g}"] if args.budget else [])]
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    loads: list[list[float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(30.0):
            loads.append([round(time.time(), 1), *os.getloadavg()])

    threading.Thread(target=sample, daemon=True).start()
    started = time.time()
    load_before = os.getloadavg()
    log = args.work / f"{args.name}.stderr.log"
    with log.open("w") as err:
        code = subprocess.run(timer + command, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                              check=False).returncode
    done.set()
    wall = time.time() - started
    stderr = log.read_text()
    report = json.loads((out / "compress.json").read_text()) if (out / "compress.json").is_file() else {}
    time_rss = next((int(line.split(":")[1]) * 1024 for line in stderr.splitlines()
                     if "Maximum resident set size" in line), None)
    result = {
        "command": " ".join(command), "size": args.size, "widths": SIZES[args.size], "join": args.join,
        "budget_minutes": args.budget, "exit_code": code, "wall_seconds": round(wall, 1),
        "cpu": cpu_facts(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "load_average_samples": loads, "plan_line": next((line for line in stderr.splitlines()
                                                         if "plan (estimated" in line), None),
        "cap_notes": [line for line in stderr.splitlines() if "capped" in line or "estimated at" in line],
        "notes": report.get("notes"), "why": report.get("why"),
        "estimate": report.get("estimate"), "phases": report.get("phases"), "seconds": report.get("seconds"),
        "peak_rss_bytes": report.get("peak_rss_bytes"), "peak_rss_bytes_time_v": time_rss,
        "winner": report.get("winner"), "warnings": report.get("warnings"), "seq_len": report.get("seq_len"),
        "batch_size": report.get("batch_size"),
        "candidates": [{k: c.get(k) for k in ("name", "predicted_speedup", "measured_speedup", "drop", "seconds")}
                       for c in report.get("candidates", [])],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("exit_code", "wall_seconds", "plan_line", "peak_rss_bytes")}, indent=2))
    sys.exit(code)


if __name__ == "__main__":
    main()

"""Does a padded length that is not a multiple of 8 cost OpenVINO int8 more than the extra token would?

compress times a model at the mean of its data's padded batch lengths (all-MiniLM-L6-v2 on short texts: 63
tokens), and the unchanged int8 model read 5.3x PyTorch fp32 there, against 6.6-6.8x at 64 tokens in
experiments/latency_prediction (idle, one thread, batch 32). This times, for each length, PyTorch fp32,
OpenVINO int8 and OpenVINO bf16 side by side in one interleaved benchmark (the one timing routine), so that
each ratio is paired::

    python experiments/probes/int8_seq_length.py --lengths 56 62 63 64 65 72 --repeats 12

``--no-reference`` times only the runtimes, each length in its own round (a sweep of many lengths in a minute;
milliseconds, no ratio to PyTorch)::

    python experiments/probes/int8_seq_length.py --no-reference --runtimes openvino-int8 --repeats 5 \
        --lengths $(seq 40 80) 96 112 128 --out experiments/probes/results/int8_seq_length_sweep.json

Prints a table and writes ``results/int8_seq_length.json`` (or ``--out``) with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import surgery
from surgery.compress.latency_measure import runtime_model
from surgery.measure.machine import machine_info
from surgery.measure.timing import make_inputs, time_models

HERE = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[56, 60, 62, 63, 64, 65, 72])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runtimes", nargs="+", default=["openvino-int8", "openvino-bf16"])
    parser.add_argument("--out", type=Path, default=HERE / "int8_seq_length.json")
    parser.add_argument("--no-reference", action="store_true", help="time the runtimes only (milliseconds)")
    args = parser.parse_args()
    model = surgery.from_pretrained("minilm-l6").eval()
    vocab = int(model.config.vocab_size)
    work = Path(tempfile.mkdtemp(prefix="seq-length-"))
    served = {name: runtime_model(model, name, work / name, threads=args.threads) for name in args.runtimes}
    load_before = os.getloadavg()[0]
    rows = []
    for length in args.lengths:
        batch = make_inputs(vocab, batch_size=args.batch_size, seq_len=length)
        timed = served if args.no_reference else {"torch": model, **served}
        timing = time_models(timed, [batch], repeats=args.repeats, warmup=2, threads=args.threads)
        row: dict = {"seq_len": length}
        for name in timed:
            row[name] = {"ms": 1000 * sorted(timing.seconds[name])[args.repeats // 2]}
            if not args.no_reference and name != "torch":
                ratio, interval = timing.speedup(name)
                row[name].update(speedup=ratio, ci95=[interval.low, interval.high])
        rows.append(row)
        cells = "  ".join(f"{name} {row[name]['ms']:6.1f} ms" + (
            f" {row[name]['speedup']:.2f}x [{row[name]['ci95'][0]:.2f}-{row[name]['ci95'][1]:.2f}]"
            if "speedup" in row[name] else "") for name in timed)
        print(f"[{time.strftime('%H:%M:%S')}] {length:4d} tokens: {cells}", flush=True)
    info = machine_info()
    record = {"machine": info.model_dump(mode="json"), "fingerprint": info.fingerprint, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_before": load_before, "load_after": os.getloadavg()[0], "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

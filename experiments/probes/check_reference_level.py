"""Does an int8 table's PyTorch reference (timed in its own rounds) agree with a side-by-side benchmark?

Benchmarks MiniLM-L6 in PyTorch against its smoothed int8 graph, measures the int8 latency table with
``reference_runtime="torch"``, and benchmarks again; prints the three int8-over-PyTorch ratios::

    nice python experiments/probes/check_reference_level.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import surgery
from surgery.compress.latency_measure import measure_latency_table, runtime_model
from surgery.measure.timing import make_inputs, time_models


def bench_ratio(model: object) -> str:
    int8 = runtime_model(model, "onnxruntime-int8", Path(tempfile.mkdtemp(prefix="int8-")), threads=1)
    report = time_models({"torch": model, "int8": int8}, [make_inputs(int(model.config.vocab_size), batch_size=32,
                                                                      seq_len=64)], threads=1, repeats=10)
    ratio, interval = report.speedup("int8")
    return f"{ratio:.2f}x [{interval.low:.2f}-{interval.high:.2f}]"


def main() -> None:
    model = surgery.from_pretrained("minilm-l6")
    print(f"load {os.getloadavg()[0]:.1f}; side by side before: int8 over torch {bench_ratio(model)}", flush=True)
    table = measure_latency_table(model, runtime="onnxruntime-int8", reference_runtime="torch", batch_size=32,
                                  seq_len=64, threads=1, cache=False)
    load = table.measured["load_average"]
    print(f"table (load {load[0]:.1f}/{load[1]:.1f}): torch reference / int8 model "
          f"{table.reference_ms / table.measured['model_ms']:.2f}x", flush=True)
    print(f"side by side after: int8 over torch {bench_ratio(model)}; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

"""What OpenVINO's and NNCF's telemetry costs one int8 IR write, with it held off (surgery's default) and left on.

Each round writes a tiny BERT classifier's OpenVINO int8 IR twice in fresh subprocesses, once as surgery runs by
default and once with ``SURGERY_OPENVINO_TELEMETRY=1`` (OpenVINO's own setting decides; here no opt-out file and
no CI variable, so its default: on), in alternating order, and counts the events the telemetry sender was handed.
No event leaves the machine where there is no network; the cost measured is the senders' forked processes.
Writes ``results/telemetry_cost.json`` with the CPU model and flags and the load average::

    python experiments/probes/telemetry_cost.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, tempfile, time, torch
from pathlib import Path
from openvino_telemetry.utils import sender
events = []
real = sender.TelemetrySender.send
def counted(self, backend, message):
    events.append(1)
    return real(self, backend, message)
sender.TelemetrySender.send = counted
from surgery.runtimes import get_runtime
from surgery.testing import TinySpec, tiny_model
model = tiny_model(TinySpec("bert", task="seq-cls"))
batches = [{"input_ids": torch.randint(5, 90, (4, 16)), "attention_mask": torch.ones(4, 16, dtype=torch.long)}]
start = time.perf_counter()
get_runtime("openvino-int8").write_artefact(model, Path(tempfile.mkdtemp()) / "ir", task="auto",
                                            calibration=batches, threads=1)
print(json.dumps({"seconds": time.perf_counter() - start, "events": len(events)}))
"""


def one(left_on: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SURGERY_OPENVINO_TELEMETRY")}
    if left_on:
        env["SURGERY_OPENVINO_TELEMETRY"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "telemetry_cost.json")
    args = parser.parse_args()
    from surgery.measure.machine import machine_info

    rows: list[dict[str, object]] = []
    load_before = os.getloadavg()
    for i in range(args.rounds):
        for left_on in ((False, True) if i % 2 == 0 else (True, False)):
            rows.append({"round": i, "telemetry": "left on" if left_on else "held off (default)", **one(left_on)})
    held = [r["seconds"] for r in rows if r["telemetry"] != "left on"]
    on = [r["seconds"] for r in rows if r["telemetry"] == "left on"]
    ratios = [b["seconds"] / a["seconds"] for a, b in zip(rows[0::2], rows[1::2], strict=True)]
    ratios = [r if rows[2 * i]["telemetry"] != "left on" else 1 / r for i, r in enumerate(ratios)]
    result = {"machine": machine_info().model_dump(mode="json"), "load_before": load_before,
              "load_after": os.getloadavg(), "rows": rows,
              "summary": {"held_off_s": [min(held), statistics.median(held), max(held)],
                          "left_on_s": [min(on), statistics.median(on), max(on)],
                          "median_ratio_on_over_off": statistics.median(ratios),
                          "events_held_off": sorted({r["events"] for r in rows if r["telemetry"] != "left on"}),
                          "events_left_on": sorted({r["events"] for r in rows if r["telemetry"] == "left on"})}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()

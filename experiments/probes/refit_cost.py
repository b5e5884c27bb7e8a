"""What one cut's refit costs, against the forwards the job estimate prices it by.

The job estimate (surgery.compress.job_estimate.candidate_seconds) prices a cut's refit from the forward it timed.
This probe times, on one model directory, at the job's batch shape (32 rows of random token ids, ``--seq-len``):

* ``forward``: the original's forward, and ``small``: the cut's;
* ``refit``: :func:`surgery.training.refit.refit_projections` of the cut against the original on ``--batches``
  batches, in this process at the job's threads (what a candidate built alone runs);

for one representative cut: every layer keeps ``--keep`` of its heads and of its FFN neurons (the
highest-numbered removed; which ones matters little to the cost, which follows the widths). Each time is the median
of ``--repeats`` runs. Prints one JSON line with the CPU model and flags (lscpu).

    python experiments/probes/refit_cost.py MODEL_DIR --seq-len 128 --batches 5
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch


def lscpu() -> dict[str, str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    rows = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): rows[k].strip() for k in ("Model name", "CPU(s)", "Flags") if k in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import surgery
    from surgery.compress.candidates import apply_removal
    from surgery.compress.removal_path import Removal
    from surgery.measure.timing import make_inputs, time_once
    from surgery.persist.model_io import from_pretrained
    from surgery.training.refit import refit_projections

    torch.set_num_threads(args.threads)
    original = from_pretrained(args.model).eval()
    layers = surgery.inspect(original).layers
    removal = Removal(
        heads={i: list(range(round(layer.heads * args.keep), layer.heads)) for i, layer in enumerate(layers)},
        neurons={i: list(range(round(layer.ffn_width * args.keep), layer.ffn_width)) for i, layer in enumerate(layers)})
    vocab = int(original.config.vocab_size)
    inputs = make_inputs(vocab, batch_size=args.batch_size, seq_len=args.seq_len, device=torch.device("cpu"))
    batches = [make_inputs(vocab, batch_size=args.batch_size, seq_len=args.seq_len, seed=1 + i,
                           device=torch.device("cpu")) for i in range(args.batches)]
    cut = copy.deepcopy(original)
    apply_removal(cut, removal)
    forward = statistics.median(time_once(original, inputs) for _ in range(args.repeats))
    small = statistics.median(time_once(cut, inputs) for _ in range(args.repeats))
    refits = []
    for _ in range(args.repeats):
        student = copy.deepcopy(cut)
        since = time.perf_counter()
        refit_projections(student, original, batches)
        refits.append(time.perf_counter() - since)
    refit = statistics.median(refits)
    per_batch = refit / args.batches
    print(json.dumps({
        "model": str(args.model), "seq_len": args.seq_len, "batch_size": args.batch_size, "batches": args.batches,
        "keep": args.keep, "threads": args.threads, "layers": len(layers), "forward_s": round(forward, 3),
        "small_s": round(small, 3), "refit_s": round(refit, 3), "refit_runs_s": [round(r, 3) for r in refits],
        "refit_per_batch_over_forward": round(per_batch / forward, 3),
        "estimate_before_s": round(len(layers) * args.batches * (forward + small), 3),
        "cpu": lscpu(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()

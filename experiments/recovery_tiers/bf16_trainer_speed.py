"""HF Trainer steps/s in bf16 autocast against fp32 on a CPU, and the loss curves of both (torch + transformers only).

The shape of ``bench_recovery_tiers.py --part speed`` for a machine that holds PyTorch and transformers but
not this project's other dependencies (the lent GPU machines' image, whose CPU has bf16 instructions where
this project's shared CPU of this session has none): a MiniLM-L6-shaped ``BertForSequenceClassification``
(hidden 384, 6 layers, 12 heads, FFN 1536, vocabulary 30522; random weights, which do not change a step's
time), batch 32 x 64 tokens, the Trainer's own switch (``TrainingArguments(bf16=True, use_cpu=True)``,
as ``surgery.training.training_arguments(bf16=True)`` sets it), the GPU hidden.

* speed: at 1 and 2 threads, alternating rounds (fp32 then bf16, then bf16 then fp32 ...), each round a
  fresh Trainer of ``--steps`` steps timed from step begin to step end (the first left out);
* loss: the same model, seed and batches trained ``--loss-steps`` steps in fp32 and in bf16 on a learnable
  rule (label = parity of the first two token ids), the per-step training loss of each.

    CUDA_VISIBLE_DEVICES= python experiments/recovery_tiers/bf16_trainer_speed.py --out results/bf16_speed.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

MINILM_L6 = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                 vocab_size=30522, max_position_embeddings=512, num_labels=2)


class StepTimer(TrainerCallback):
    """Seconds of each optimiser step, and the logged loss of each (``bench_recovery_tiers.py`` times with it too)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.losses: list[float] = []
        self.started = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self.started)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def rows(n: int, seed: int, rule: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 20000, (n, 64), generator=gen)
    labels = (ids[:, 1] + ids[:, 2]) % 2 if rule else torch.randint(0, 2, (n,), generator=gen)
    return [{"input_ids": i, "attention_mask": torch.ones(64, dtype=torch.long), "labels": y}
            for i, y in zip(ids, labels, strict=True)]


def train(model: torch.nn.Module, data: list[dict[str, Any]], bf16: bool, *, lr: float = 5e-5) -> StepTimer:
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, num_train_epochs=1, per_device_train_batch_size=32, learning_rate=lr,
                                 lr_scheduler_type="linear", save_strategy="no", eval_strategy="no",
                                 logging_strategy="steps", logging_steps=1, report_to=[], seed=0, data_seed=0,
                                 disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, bf16=bf16)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[timer])
        trainer.train()
    return timer


def cpu() -> dict[str, Any]:
    flags = []
    model = platform.processor()
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    wanted = ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx512_vnni"]
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if Path("/usr/bin/lscpu").exists() else ""
    return {"cpu_model": model, "flags": [f for f in wanted if f in flags], "logical_cpus": os.cpu_count(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "lscpu": lscpu[:3000]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--loss-steps", type=int, default=60)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer, 48-wide model: checks the script runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = {**MINILM_L6, "hidden_size": 48, "num_hidden_layers": 2, "intermediate_size": 96} if args.smoke \
        else MINILM_L6
    base = BertForSequenceClassification(BertConfig(**shape))
    out: dict[str, Any] = {"machine": cpu(), "model": shape, "batch": 32, "seq_len": 64, "steps_per_round": args.steps,
                           "rounds": args.rounds, "threads": {}}
    data = rows(32 * args.steps, 0)
    for threads in args.threads:
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        ratios = []
        for r in range(args.rounds):
            this = {}
            for mode in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                # A fresh copy per run: a bf16 Trainer leaves accelerate's autocast wrapper on the model it
                # prepared (what surgery's restore_forward removes), so reusing one model made every later
                # run bf16 (results/device_trainer_reused_model_INVALID.json).
                model = copy.deepcopy(base)
                this[mode] = statistics.median(train(model, data, mode == "bf16").seconds[1:])
                times[mode].append(this[mode])
            ratios.append(this["fp32"] / this["bf16"])
            print(f"threads {threads} round {r}: fp32 {this['fp32']:.3f}s bf16 {this['bf16']:.3f}s "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        out["threads"][str(threads)] = {
            "fp32_step_s": times["fp32"], "bf16_step_s": times["bf16"], "ratio_per_round": ratios,
            "median_ratio": statistics.median(ratios), "fp32_steps_per_s": 1 / statistics.median(times["fp32"]),
            "bf16_steps_per_s": 1 / statistics.median(times["bf16"]), "load_average": list(os.getloadavg())}
    torch.set_num_threads(max(args.threads))
    task = rows(32 * args.loss_steps, 1, rule=True)
    curves = {}
    for mode in ("fp32", "bf16"):
        curves[mode] = train(copy.deepcopy(base), task, mode == "bf16", lr=1e-4).losses
    diffs = [abs(a - b) for a, b in zip(curves["fp32"], curves["bf16"], strict=False)]
    out["loss"] = {"steps": args.loss_steps, "fp32": curves["fp32"], "bf16": curves["bf16"],
                   "max_abs_diff": max(diffs), "mean_abs_diff": statistics.mean(diffs),
                   "last10_mean": {m: statistics.mean(c[-10:]) for m, c in curves.items()}}
    print(json.dumps({k: out["loss"][k] for k in ("max_abs_diff", "mean_abs_diff", "last10_mean")}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""``torchrun --nproc_per_node 2`` (gloo, CPU) runs ``surgery apply`` with recovery like one process does.

The same command runs once in this process and once under torchrun with two processes. The batch
size is the global batch (each process takes half of it), so both runs take the same examples in
the same steps; dropout is off, so the only difference left is the order of floating-point sums
in the gradient all-reduce. The saved weights must agree to within ``TOLERANCE`` (max abs), the
reports' accuracies exactly, and only the main process writes. The torchrun child has a hard
timeout, so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from surgery.cli.app import app
from surgery.testing import TinySpec, tiny_model

#: Largest difference accepted between the one- and two-process weights (float32 all-reduce order).
TOLERANCE = 1e-5
#: A two-process run takes about 15 s here; anything near this limit is a hang.
TIMEOUT = 120
ROWS = 40  # a 10% evaluation split leaves 36 training rows: 9 full batches of 4 (2 per process)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers import labelled_rows, tiny_tokenizer, write_rows

    root = tmp_path_factory.mktemp("ddp")
    model = tiny_model(TinySpec("bert"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    return {"root": root, "model": root / "model", "data": write_rows(root / "train.csv", labelled_rows(ROWS))}


def _apply_args(ws: dict[str, Path], out: Path) -> list[str]:
    return ["apply", str(ws["model"]), "-s", "ffn-prune", "--set", "ratio=0.5", "--data", str(ws["data"]),
            "--recover-epochs", "2", "--batch-size", "4", "--max-length", "16", "--out", str(out),
            "--report", str(out.with_suffix(".json"))]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_like_one(workspace: dict[str, Path]) -> None:
    single, double = workspace["root"] / "single", workspace["root"] / "double"
    result = CliRunner().invoke(app, _apply_args(workspace, single))
    assert result.exit_code == 0, result.output
    # gloo on the CPU: hidden GPUs, or with fewer GPUs than processes both ranks would share one under NCCL.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SURGERY_PLUGINS": "", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "surgery.cli", *_apply_args(workspace, double)],
                         capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(f"saved to {double}") == 1  # only the main process writes and reports
    one, two = load_file(single / "model.safetensors"), load_file(double / "model.safetensors")
    assert one.keys() == two.keys()
    worst = max(float((one[k].float() - two[k].float()).abs().max()) for k in one)
    assert worst <= TOLERANCE, f"two-process weights differ from one-process by {worst}"
    print(f"largest difference between one- and two-process weights: {worst:.2e}")
    source = load_file(workspace["model"] / "model.safetensors")
    kept = "bert.embeddings.word_embeddings.weight"  # not cut by ffn-prune: changed only by training
    assert float((one[kept] - source[kept.removeprefix("bert.")]).abs().max()) > 10 * TOLERANCE  # it trained
    reports = [json.loads(p.with_suffix(".json").read_text()) for p in (single, double)]
    recovered = [r["checks"][0]["recovery"] for r in reports]
    assert [r["steps"] for r in recovered] == [18, 18]  # 2 epochs of 9 global batches, in both runs
    assert recovered[0]["accuracy_after"] == recovered[1]["accuracy_after"]
    for one_epoch, two_epoch in zip(recovered[0]["history"], recovered[1]["history"], strict=True):
        # The two-process figures are summed over both processes, so they describe the same epoch.
        assert two_epoch["train_acc"] == one_epoch["train_acc"]
        assert two_epoch["loss"] == pytest.approx(one_epoch["loss"], abs=TOLERANCE)

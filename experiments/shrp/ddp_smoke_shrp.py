"""2-process CPU (gloo) smoke test of SHRP training under DDP.

Run: ``torchrun --nproc_per_node 2 experiments/shrp/ddp_smoke_shrp.py``. Each rank converts the same tiny
BERT, trains it progressively with :class:`ShrpTrainer` + :class:`ProgressiveConversion` (the path a
user's own Trainer code takes) and at the end checks that every rank holds identical weights,
i.e. the gradients of routed experts (and of bypassed, unused layers) were reduced correctly.
"""

from __future__ import annotations

import sys
import tempfile

import datasets
import torch
import torch.distributed as dist

import surgery
from surgery.core.distributed import end_process, leave_process_group
from surgery.data.task_data import PaddingCollator
from surgery.strategies import ExpertAttentionStrategy
from surgery.strategies.shrp import (
    ProgressiveConversion,
    ShrpConfig,
    ShrpTrainer,
    ShrpTrainingState,
    prepare_progressive,
    shrp_training_arguments,
)
from surgery.testing import TinySpec, tiny_model


def main() -> None:
    torch.set_num_threads(1)
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=3), num_labels=2).train()
    order = [2, 1]
    originals = {i: model.bert.encoder.layer[i] for i in order}
    surgery.convert(model, ExpertAttentionStrategy(layers=order))
    layers = prepare_progressive(model, originals)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (64, 8), generator=gen)
    ids[:, 0] = 2
    rows = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 8] * 64,
                                       "labels": (ids[:, 1] > 50).long().tolist()})
    state = ShrpTrainingState()
    callback = ProgressiveConversion(layers, order, state, balance_weight=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        args = shrp_training_arguments(ShrpConfig(batch_size=8, learning_rate=1e-3), len(order) + 1, tmp,
                                  ddp_backend="gloo")
        trainer = ShrpTrainer(model=model, args=args, train_dataset=rows, data_collator=PaddingCollator(None),
                              callbacks=[callback], shrp_state=state)
        trainer.train()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], g) for g in gathered[1:])
    if dist.get_rank() == 0:
        print(f"world={dist.get_world_size()} epochs={len(state.history)} weights identical across ranks: {same}")
    # Every rank waits for the others, then ends without torch's gloo teardown, which can deadlock at
    # exit (about one run in fifteen; see surgery.core.distributed.leave_process_group).
    leave_process_group()
    if not same:
        print("DDP ranks diverged", file=sys.stderr)
    end_process(0 if same else 1)


if __name__ == "__main__":
    main()

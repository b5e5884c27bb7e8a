"""Linear probes on frozen MiniLM-L6: which sentence representation carries the Rotten Tomatoes signal?

Used to choose what classifier-mode prompt tuning trains (docs/doe.md): features are the pooler
output, the [CLS] state and the masked mean of the last hidden states; a linear classifier is trained
on each with AdamW at two learning rates and two step counts. Prints one line per setting.

    python experiments/probes/probe_minilm_pooling.py
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from surgery.data.task_data import load_task_data
from surgery.persist.assets import resolve_model_path


def main() -> None:
    torch.set_num_threads(1)
    path = resolve_model_path("minilm-l6")
    tok = AutoTokenizer.from_pretrained(path)
    data = load_task_data("rotten-tomatoes", tok, max_train=1200, max_eval=300, seed=0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).eval()

    def features(split: str) -> list[torch.Tensor]:
        pooled, cls, mean, labels = [], [], [], []
        with torch.no_grad():
            for batch in data.loader(split, batch_size=64):
                labels.append(batch.pop("labels"))
                out = model.base_model(**batch)
                h, mask = out.last_hidden_state, batch["attention_mask"].unsqueeze(-1).float()
                pooled.append(out.pooler_output)
                cls.append(h[:, 0])
                mean.append((h * mask).sum(1) / mask.sum(1))
        return [torch.cat(x) for x in (pooled, cls, mean, labels)]

    start = time.time()
    train, evaluation = features("train"), features("eval")
    print(f"features in {time.time() - start:.1f}s")
    for name, i in (("pooler", 0), ("cls", 1), ("mean", 2)):
        for lr in (2e-3, 1e-2):
            for steps in (38, 150):
                torch.manual_seed(0)
                probe = torch.nn.Linear(train[i].shape[1], 2)
                opt = torch.optim.AdamW(probe.parameters(), lr=lr)
                for _ in range(steps):
                    idx = torch.randint(0, len(train[i]), (32,))
                    loss = torch.nn.functional.cross_entropy(probe(train[i][idx]), train[3][idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                acc = (probe(evaluation[i]).argmax(-1) == evaluation[3]).float().mean().item()
                print(f"{name:6s} lr={lr:g} steps={steps:3d} accuracy={acc:.3f}")


if __name__ == "__main__":
    main()

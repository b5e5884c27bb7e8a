"""Embedding recovery on a fixed deep cut: what compress's distillation tier wins back in a fixed budget.

The emb-8x rows of bench_deep_cuts.py pick a cut that drops one of all-MiniLM-L6-v2's six layers and lose 8 held-out
points of mean cosine before recovery; distillation then ran 6 epochs over the 4,000 training texts while its
training loss kept falling and the held-out fidelity stopped far short of it (the texts are learned, not the
teacher). This probe holds the cut fixed and runs compress's own tier (``train_tiers`` with distillation only, its
step-timed estimate sizing the run to ``--seconds``) on the bench's seeded split, with the code on ``PYTHONPATH``
(run it once per checkout to compare two versions of the tier) and ``--copies`` masked copies of the training texts
(``EMBEDDING_MASKED_COPIES``). Fidelity is read in PyTorch fp32 on the 2,000 test texts that chose nothing: mean
cosine and recall@10 against the original, before and after.

The cut: layer 2 dropped, then 10% of the heads left removed by magnitude (global ranking), as
``LayerDropStrategy`` and ``HeadPruningStrategy`` do it: the same for every condition of a seed.

    PYTHONPATH=. python experiments/deep_cuts/emb_recovery_probe.py --seeds 0 1 2 --copies 0 --seconds 600 \\
        --label tier-copies0 --out experiments/deep_cuts/results/emb_recovery_probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery
from experiments.compress.bench_compress import embedding_split
from experiments.record import finish_record, new_record
from surgery.compress import training_tier
from surgery.compress.structure import Structure
from surgery.embedding.evaluate import embed_texts, mean_cosine, retrieval_agreement


def fidelity(student: Any, teacher_emb: torch.Tensor, split: dict[str, Any]) -> dict[str, float]:
    emb = embed_texts(student, split["tokenizer"], split["test_texts"], split["sentence"], max_length=64)
    return {"mean_cosine": round(mean_cosine(emb, teacher_emb), 5),
            "recall_at_10": round(retrieval_agreement(emb, teacher_emb, k=10), 4)}


def cut_of(original: Any) -> Any:
    from strategies.pruning.head_prune import HeadPruningStrategy
    from strategies.pruning.layer_drop import LayerDropStrategy

    student = copy.deepcopy(original)  # convert cuts in place
    surgery.convert(student, LayerDropStrategy(layers=[2]))
    surgery.convert(student, HeadPruningStrategy(ratio=0.1, importance="magnitude"))
    return student


def run(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(seed)
    split = embedding_split(args.model, seed)
    original = split["original"]
    teacher_emb = embed_texts(original, split["tokenizer"], split["test_texts"], split["sentence"], max_length=64)
    student = cut_of(original).eval()
    before = fidelity(student, teacher_emb, split)
    if hasattr(training_tier, "EMBEDDING_MASKED_COPIES"):
        training_tier.EMBEDDING_MASKED_COPIES = args.copies
    elif args.copies:
        raise SystemExit("--copies needs a checkout whose training tier has EMBEDDING_MASKED_COPIES")
    started = time.perf_counter()
    training = training_tier.train_tiers(student, original, split["data"], args.seconds, batch_size=32, seed=seed,
                                         order=("distil",))
    seconds = time.perf_counter() - started
    after = fidelity(student.eval(), teacher_emb, split)
    distil = next((t for t in training["tiers"] if t["tier"] == "distil"), {})
    return {"seed": seed, "copies": args.copies, "budget_s": args.seconds, "seconds": round(seconds, 1),
            "before": before, "after": after, "steps": distil.get("steps"), "epochs_run": distil.get("epochs_run"),
            "curve": distil.get("curve"), "time_limit_reached": distil.get("time_limit_reached"),
            "estimate": training["estimates"].get("distil"), "bf16": training["bf16"],
            "structure": [None if layer is None else {"heads": layer.heads, "ffn_width": layer.ffn_width}
                          for layer in Structure.from_model(student).kept]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--copies", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--label", required=True, help="this condition's name in the results file")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    for seed in args.seeds:
        record = new_record("emb_recovery_probe", f"{args.label}|{seed}", command=" ".join(sys.argv),
                            config={k: str(v) for k, v in vars(args).items()})
        start = time.perf_counter()
        record.update(run(seed, args))
        results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
        results["runs"][f"{args.label}|{seed}"] = finish_record(record, time.perf_counter() - start)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(args.out)
        print(args.label, seed, record["before"], record["after"], record["steps"], flush=True)


if __name__ == "__main__":
    main()

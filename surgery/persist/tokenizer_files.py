"""A model directory's tokenizer: whether it has one, and loading it without running its code.

transformers v5 happily builds an empty tokenizer (special tokens only) for a directory without any
vocabulary file, which would silently turn every text into ``[UNK]``; so a tokenizer is loaded only
from a directory that holds one of :data:`TOKENIZER_FILES`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from surgery.core.errors import ModelLoadError
from surgery.persist.untrusted import path_inside, read_json_file, refuse_custom_code

TOKENIZER_CONFIG = "tokenizer_config.json"

#: Files from which a tokenizer can really be rebuilt.
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spm.model", "spiece.model",
    "sentencepiece.bpe.model",
)


def has_tokenizer(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds files a tokenizer can be rebuilt from.

    Example:
        >>> has_tokenizer("/nonexistent")
        False
    """
    return any((Path(path) / name).exists() for name in TOKENIZER_FILES)


def read_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in ``path`` (``trust_remote_code`` off); None if the directory has none.

    Example:
        >>> read_tokenizer("/nonexistent") is None
        True
    """
    where = Path(path)
    if not has_tokenizer(where):
        return None
    from transformers import AutoTokenizer

    refuse_custom_code(where)  # also refuses links out of the directory
    check_tokenizer_paths(where)
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"cannot load the tokenizer in {where}: {detail}") from None


def check_tokenizer_paths(path: str | os.PathLike[str]) -> None:
    """Refuse a ``tokenizer_config.json`` whose ``fast_tokenizer_files`` name a file outside its directory.

    transformers opens the entry of ``fast_tokenizer_files`` it picks relative to the directory, so
    ``../elsewhere/tokenizer.4.0.json`` would be read from outside. The ``vocab_file``/``tokenizer_file``
    keys are not checked: transformers opens the files of the directory itself in their place (many
    published configs record their author's absolute paths there, harmlessly).

    Example:
        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> named = {"fast_tokenizer_files": ["../x/tokenizer.4.0.json"]}
        >>> _ = (d / "tokenizer_config.json").write_text(json.dumps(named))
        >>> check_tokenizer_paths(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../tokenizer_config.json names '../x/tokenizer.4.0.json', which leads ...
    """
    file = Path(path) / TOKENIZER_CONFIG
    if not file.is_file():
        return
    raw = read_json_file(file, what=TOKENIZER_CONFIG)
    if not isinstance(raw, dict):
        return  # transformers reports a config that is not a mapping
    named = raw.get("fast_tokenizer_files")
    for value in [v for v in (named if isinstance(named, list) else [named]) if isinstance(v, str)]:
        path_inside(path, value, named_in=file)

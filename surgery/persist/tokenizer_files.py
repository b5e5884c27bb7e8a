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
from surgery.persist.untrusted import refuse_custom_code

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

    refuse_custom_code(where)
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"cannot load the tokenizer in {where}: {detail}") from None

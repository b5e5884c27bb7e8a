"""The tokenizer files an export writes: set up for serving, as the source model is used, not as the parity batch was.

Stock servers and the ``tokenizers`` library load ``tokenizer.json`` as it is, truncation and padding
included. A transformers tokenizer keeps whatever truncation and padding its last call asked for in
that file (the export's parity batch: fixed length 32), so an export must not save it as it comes
out of the parity check. :func:`save_serving_tokenizer` writes it truncating at the model's maximum
sequence length and padding to the longest text of each batch:

* ``sentence_bert_config.json``'s ``max_seq_length`` where the source model has one (what
  sentence-transformers truncates at);
* else the tokenizer's ``model_max_length`` (what ``tokenizer(texts, truncation=True)`` truncates
  at), when it is set;
* else the positions the model has (``max_position_embeddings``, less the positions RoBERTa-style
  models reserve before their first token).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from surgery.core.errors import SurgeryError
from surgery.persist.config_values import usable_positions

#: transformers' "no limit" model_max_length (``VERY_LARGE_INTEGER``) and anything close to it.
NO_LIMIT = 10**12


def source_max_seq_length(directory: str | None) -> int | None:
    """``max_seq_length`` of the sentence-transformers directory a model was loaded from; None if none.

    Example:
        >>> source_max_seq_length(None) is None
        True
    """
    if not directory or not Path(directory).is_dir():
        return None
    from surgery.embedding.pooling import read_sentence_config

    try:
        sentence = read_sentence_config(directory)
    except SurgeryError:
        return None  # a pipeline surgery does not read: its tokenizer's own limit applies
    return sentence.max_seq_length if sentence is not None else None


def serving_max_length(config: Any, tokenizer: Any, max_seq_length: int | None = None) -> int | None:
    """The number of tokens a served text is cut to; None when neither the tokenizer nor the config sets one.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(max_position_embeddings=514, pad_token_id=1, model_type="roberta")
        >>> serving_max_length(config, SimpleNamespace(model_max_length=10**30))
        512
        >>> serving_max_length(config, SimpleNamespace(model_max_length=256)), serving_max_length(config, None, 128)
        (256, 128)
    """
    if max_seq_length:
        return int(max_seq_length)
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < NO_LIMIT:
        return limit
    return usable_positions(config)


def save_serving_tokenizer(tokenizer: Any, out_dir: Path, max_length: int | None) -> None:
    """Save ``tokenizer`` into ``out_dir`` with ``tokenizer.json`` truncating at ``max_length`` and padding per batch.

    The caller's tokenizer is left as it is (the settings go onto a copy of its backend).

    Example:
        >>> import json, tempfile
        >>> from transformers import BertTokenizer
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])})
        >>> _ = tok(["a"], padding="max_length", truncation=True, max_length=32)  # leaves Fixed(32) behind
        >>> d = Path(tempfile.mkdtemp())
        >>> save_serving_tokenizer(tok, d, 128)
        >>> saved = json.loads((d / "tokenizer.json").read_text())
        >>> saved["truncation"]["max_length"], saved["padding"]["strategy"]
        (128, 'BatchLongest')
    """
    tokenizer.save_pretrained(out_dir)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not (out_dir / "tokenizer.json").exists():
        return  # a slow tokenizer's files (vocab.txt, ...) carry no truncation or padding
    backend = copy.deepcopy(backend)
    backend.no_truncation()
    backend.no_padding()
    if max_length:
        side = getattr(tokenizer, "truncation_side", "right")
        backend.enable_truncation(max_length, direction=side if side in ("left", "right") else "right")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is not None:
        side = getattr(tokenizer, "padding_side", "right")
        backend.enable_padding(direction=side if side in ("left", "right") else "right", pad_id=int(pad_id),
                               pad_type_id=int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
                               pad_token=str(tokenizer.pad_token))
    backend.save(str(out_dir / "tokenizer.json"))

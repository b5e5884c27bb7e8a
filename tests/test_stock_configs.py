"""Every family from its stock default config, not only from the tiny configs of the other tests.

Stock configs differ from ours in what they leave out: ``DebertaV2Config()`` has no
``position_buckets`` and relative attention off, ModernBERT alternates local and global attention
from its own layer pattern, ELECTRA projects a smaller embedding. Each family's stock config is
converted to Expert Attention (every layer), saved, reloaded (outputs equal) and exported to ONNX
(parity checked).

Scaled down for speed, and only where it does not change the architecture: one layer instead of the
stock 6 to 24 (every layer is the same module) and a 1024-token vocabulary (the stock 30k to 250k
rows only make the embedding table and the export slower), with special token ids that lie beyond
it moved into it. Hidden sizes, heads, FFN widths, positions and every attention setting are stock.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import surgery
from surgery.runtimes.onnx import export_onnx
from surgery.strategies import ExpertAttentionStrategy
from surgery.testing import FAMILIES, TinySpec, tiny_config

VOCAB = 1024
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


def stock_config(family: str) -> transformers.PretrainedConfig:
    """The family's default config with one layer and a 1024-token vocabulary; everything else stock."""
    config_class = type(tiny_config(TinySpec(family)))
    stock = config_class()
    kwargs: dict[str, object] = {"n_layers" if family == "distilbert" else "num_hidden_layers": 1,
                                 "vocab_size": VOCAB}
    for offset, name in enumerate(SPECIAL_IDS):
        value = getattr(stock, name, None)
        if isinstance(value, int) and value >= VOCAB:
            kwargs[name] = offset
    return config_class(**kwargs)


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("family", FAMILIES)
def test_stock_config_converts_saves_reloads_and_exports(family: str, tmp_path: Path) -> None:
    config = stock_config(family)
    assert config.hidden_size == type(config)().hidden_size  # the hidden size is the stock one
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    surgery.convert(model, ExpertAttentionStrategy())
    assert [layer.kind for layer in surgery.inspect(model).layers] == ["expert-attention"]
    back = surgery.from_pretrained(surgery.save_pretrained(model, tmp_path / "saved"))
    ids = torch.randint(5, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state, back(input_ids=ids).last_hidden_state)
    report = export_onnx(back, tmp_path / "onnx", batch=2, seq=8)
    assert report.parity.max_abs_diff <= 1e-4

"""Models saved by earlier code still reload to the same outputs, on every family.

``tests/fixtures/saved/<family>/`` was written by ``tests/fixtures/make_saved_models.py`` before the
issue-10 refactor; each records head-prune, ffn-prune, zero-recovery-prune, expert-attention,
top1-prune and layer-drop steps. A change that breaks their replay (a renamed strategy, a new plan
format without a version bump) fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import surgery
from surgery.testing import FAMILIES, main_output

SAVED = Path(__file__).resolve().parent / "fixtures" / "saved"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_saved_before_the_refactor_reloads_to_the_same_outputs(family: str) -> None:
    directory = SAVED / family
    expected = load_file(str(directory / "expected.safetensors"))
    inputs = {k.removeprefix("inputs."): v for k, v in expected.items() if k.startswith("inputs.")}
    model = surgery.from_pretrained(directory).eval()
    assert [s.strategy for s in surgery.inspect(model).steps] == [
        "head-prune", "ffn-prune", "zero-recovery-prune", "expert-attention", "top1-prune", "layer-drop"]
    torch.testing.assert_close(main_output(model, inputs), expected["output"], rtol=1e-5, atol=1e-5)

"""Choosing the class on load: a head that is not in the weights is never made up silently.

Every family gets the sentence-transformers layout: ``architectures`` names a masked-LM (or a
classifier) but the safetensors hold only the encoder (or another head).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import surgery
from surgery.core.errors import ConfigError, ModelLoadError
from surgery.persist.task_heads import HeadWarning, checkpoint_keys, loaded_class_name, new_head_keys, safetensors_keys
from surgery.strategies.doe.prompt_tuning import make_task
from surgery.testing import Task, TinySpec, tiny_model
from tests.helpers import one_family_fast


def class_name(model: torch.nn.Module, suffix: str) -> str:
    return type(model.config).__name__.replace("Config", suffix)


def save_as(tmp: Path, family: str, task: Task, architectures: str) -> Path:
    """A tiny model of ``task`` saved by transformers, its config naming the class ``architectures``."""
    model = tiny_model(TinySpec(family, task=task))
    out = tmp / f"{family}-{task}-as-{architectures}"
    model.save_pretrained(out)  # writes its own class into architectures; name another one, as such checkpoints do
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": [class_name(model, architectures)]}))
    return out


def load(path: Path, **kwargs: object) -> tuple[torch.nn.Module, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = surgery.from_pretrained(path, **kwargs)
    return model, [str(w.message) for w in caught if issubclass(w.category, HeadWarning)]


@pytest.mark.parametrize("family", one_family_fast())
def test_encoder_only_checkpoint_naming_a_masked_lm(family: str, tmp_path: Path) -> None:
    path = save_as(tmp_path, family, "base", "ForMaskedLM")
    model, said = load(path)
    # The bare encoder, not a masked LM with a random head; and one line that says so.
    assert type(model).__name__ == class_name(model, "Model")
    assert len(said) == 1 and "\n" not in said[0]
    assert f"names {class_name(model, 'ForMaskedLM')} but the weights hold no" in said[0]
    assert loaded_class_name(path, model.config) == class_name(model, "Model")
    # Asked for explicitly: refused in one line, unless a new head is opted into.
    with pytest.raises(ModelLoadError, match=r"hold no .*ForMaskedLM head .*allow_new_head") as err:
        surgery.from_pretrained(path, model_class=class_name(model, "ForMaskedLM"))
    assert "\n" not in str(err.value)
    mlm, said = load(path, model_class=class_name(model, "ForMaskedLM"), allow_new_head=True)
    assert type(mlm).__name__.endswith("ForMaskedLM") and new_head_keys(mlm) and not said
    # DoE's MLM mode never works on the made-up head, and auto does not pick it.
    tokenizer = type("Tok", (), {"mask_token_id": 4, "pad_token_id": 0})()
    for mode in ("auto", "mlm"):
        with pytest.raises(ConfigError, match="newly initialised"):
            make_task(mlm, mode=mode, tokenizer=tokenizer)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", one_family_fast())
def test_real_heads_load_as_named(family: str, tmp_path: Path) -> None:
    mlm, said = load(save_as(tmp_path, family, "mlm", "ForMaskedLM"))
    assert type(mlm).__name__.endswith("ForMaskedLM") and not said and not new_head_keys(mlm)
    # A classifier whose config names a masked LM loads as the classifier its weights hold.
    cls, said = load(save_as(tmp_path, family, "seq-cls", "ForMaskedLM"))
    assert type(cls).__name__.endswith("ForSequenceClassification")
    assert len(said) == 1 and "ForSequenceClassification, whose weights they hold" in said[0]


def test_header_only_and_legacy_names(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"encoder.LayerNorm.gamma": torch.zeros(1000), "cls.b": torch.zeros(3)}, str(path))
    # Only the header is read: the keys survive cutting the tensor data off.
    raw = path.read_bytes()
    path.write_bytes(raw[:8 + int.from_bytes(raw[:8], "little") + 10])
    assert checkpoint_keys(tmp_path) == {"encoder.LayerNorm.weight", "cls.b"}
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        safetensors_keys(tmp_path / "bad.safetensors")
    assert checkpoint_keys(tmp_path / "nothing-here") is None


def test_cli_says_it_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from surgery.cli.app import app

    path = save_as(tmp_path, "mpnet", "base", "ForMaskedLM")
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "hold no MPNetForMaskedLM head" in line]
    assert len(said) == 1 and said[0].startswith("warning: config.json names MPNetForMaskedLM")
    assert "MPNetModel" in result.stdout

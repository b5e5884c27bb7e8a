"""Lookups import only what they need: one method by name, the adapter table once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from surgery.core import registry
from surgery.core.errors import StrategyNotFoundError


def loaded_methods_after(call: str) -> set[str]:
    """The method modules of surgery.strategies imported by ``call`` in a fresh interpreter."""
    code = (f"import sys\nfrom surgery.core import registry\n{call}\n"
            "print(' '.join(m for m in sys.modules if m.startswith('surgery.strategies.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.slow
def test_looking_one_method_up_imports_only_its_entry_point() -> None:
    shrp = loaded_methods_after("registry.get_method('shrp')")
    assert "surgery.strategies.shrp.shrp" in shrp
    assert not any(m.startswith("surgery.strategies.doe") for m in shrp), shrp  # DoE is another method
    head = loaded_methods_after("registry.get_method('head-prune')")
    assert "surgery.strategies.pruning.head_prune" in head
    assert not any(m.startswith(("surgery.strategies.doe", "surgery.strategies.shrp")) for m in head), head


@pytest.mark.slow
def test_an_unknown_method_imports_no_method_and_names_the_installed_ones() -> None:
    assert loaded_methods_after(
        "try:\n    registry.get_method('nope')\nexcept Exception as e:\n    print(e, file=sys.stderr)") == set()
    with pytest.raises(StrategyNotFoundError, match=r"installed strategies: .*head-prune"):
        registry.get_method("nope")


def test_the_adapter_table_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.refresh()
    assert registry.adapter_class_for("bert").__name__ == "BertAdapter"
    calls = []
    monkeypatch.setattr(registry, "_all", lambda group: calls.append(group) or {})
    for model_type in ("bert", "distilbert", "bert"):
        registry.adapter_class_for(model_type)
    assert calls == []  # answered from the table built by the first lookup
    registry.refresh()  # and rebuilt after a refresh
    with pytest.raises(Exception, match="unsupported model type 'bert'"):
        registry.adapter_class_for("bert")
    assert calls == ["surgery.encoders"]
    monkeypatch.undo()
    registry.refresh()
    assert registry.adapter_class_for("bert").__name__ == "BertAdapter"

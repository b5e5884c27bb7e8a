"""OpenVINO's and NNCF's usage telemetry is held off inside surgery's calls, and left as it was outside them.

No event leaves the machine here: the telemetry package's sender is replaced by a list.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("openvino", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")
pytest.importorskip("nncf", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")
pytest.importorskip("openvino_telemetry", reason="this OpenVINO has no telemetry package")

from openvino_telemetry import Telemetry
from openvino_telemetry.utils.sender import TelemetrySender

from surgery.runtimes import get_runtime
from surgery.runtimes.openvino.vendor_telemetry import ENV_VAR, _instance, vendor_telemetry_held_off
from surgery.testing import TinySpec, tiny_model

pytestmark = pytest.mark.openvino


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """Events the telemetry package would send, with OpenVINO's default for a user who never opted in or out (no
    opt-in file in a fresh home, not in CI): it sends."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("CI", "TF_BUILD", "JENKINS_URL", ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    existing = _instance(Telemetry)
    if existing is not None:  # made earlier in this process (under CI=true its consent is off): as for this user
        monkeypatch.setattr(existing, "consent", True)
    events: list[Any] = []
    monkeypatch.setattr(TelemetrySender, "send", lambda self, backend, message: events.append(message))
    return events


def write_int8() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    batches = [{"input_ids": torch.randint(5, 90, (4, 16)), "attention_mask": torch.ones(4, 16, dtype=torch.long)}]
    get_runtime("openvino-int8").write_artefact(model, Path(tempfile.mkdtemp()) / "ir", task="auto",
                                                calibration=batches, threads=1)


def test_writing_an_int8_artefact_sends_nothing_and_leaves_the_users_setting(sent: list[Any]) -> None:
    write_int8()
    assert sent == []
    # Outside surgery's calls the shared object's consent is OpenVINO's own default again (no opt-in file: on).
    assert Telemetry().consent is True


def test_the_user_may_leave_it_to_openvinos_own_setting(sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    write_int8()
    assert len(sent) > 10  # the converter's and NNCF's events, as OpenVINO's setting decides


def test_a_consent_set_before_the_block_is_restored_after_it(sent: list[Any]) -> None:
    write_int8()  # the shared object exists
    telemetry = Telemetry()
    telemetry.consent = False  # as for a user who opted out
    with vendor_telemetry_held_off():
        assert telemetry.consent is False
    assert telemetry.consent is False
    telemetry.consent = True
    with vendor_telemetry_held_off():
        assert telemetry.consent is False
    assert telemetry.consent is True

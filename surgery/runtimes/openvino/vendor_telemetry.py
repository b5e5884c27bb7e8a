"""OpenVINO's and NNCF's usage telemetry, held off while surgery calls them on the user's behalf.

``openvino.convert_model`` and ``nncf.quantize`` report usage to Google Analytics unless the user has
opted out (``opt_in_out --opt_out``, which writes ``~/intel/openvino_telemetry``) or ``CI=true`` is set:
OpenVINO switched to opt-out in 2023 (openvinotoolkit/openvino#20290). Writing one int8 artefact sends
about 45 events; each is sent from a process forked by a thread pool, which waits up to 3 s for the
network. compress writes one artefact per candidate, so a run would send a thousand events the user
never asked for, and on this project's 2-core machine (offline: each send fails at once) a tiny
model's int8 write took a median 1.38x as long with them, the forked senders' CPU time
(experiments/probes/telemetry_cost.py).

surgery holds them off inside its own calls (:func:`vendor_telemetry_held_off`, around the converter
and the quantizer) and leaves the user's setting as it was. ``SURGERY_OPENVINO_TELEMETRY=1`` leaves
the choice to OpenVINO's own setting instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

#: Set to ``1`` to let OpenVINO's own setting decide inside surgery's calls too.
ENV_VAR = "SURGERY_OPENVINO_TELEMETRY"


def telemetry_left_to_openvino() -> bool:
    """Whether the user asked surgery to leave OpenVINO's telemetry to OpenVINO's own setting.

    Example:
        >>> isinstance(telemetry_left_to_openvino(), bool)
        True
    """
    return os.environ.get(ENV_VAR, "").strip() == "1"


@contextlib.contextmanager
def vendor_telemetry_held_off() -> Iterator[None]:
    """Within the block, OpenVINO's telemetry (the ``openvino_telemetry`` package NNCF and the converter share)
    declines every event, as it does for a user who opted out; after it, the consent is what it was.

    Both tools keep one shared telemetry object whose consent is read from the user's opt-in file
    each time a tool (re)initialises it, so the check is declined for the block and the object's
    current consent is set off; on leaving, the check is restored and the consent is set back (or,
    for an object first made inside the block, read again as the tools read it). Without the package
    (or with ``SURGERY_OPENVINO_TELEMETRY=1``) this does nothing.

    Example:
        >>> with vendor_telemetry_held_off():
        ...     pass
    """
    if telemetry_left_to_openvino():
        yield
        return
    try:
        from openvino_telemetry import Telemetry
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:  # no OpenVINO installed, or a version without the package: nothing is sent from here
        yield
        return
    original_check = OptInChecker.check
    before = _instance(Telemetry)
    saved = getattr(before, "consent", None)

    def declined(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined  # type: ignore[method-assign]
    if before is not None:
        before.consent = False
    try:
        yield
    finally:
        OptInChecker.check = original_check  # type: ignore[method-assign]
        after = _instance(Telemetry)
        if after is not None:
            if after is before and saved is not None:
                after.consent = saved
            else:  # made inside the block: consent as the converter and NNCF read it (no dialog, off in CI)
                result = original_check(OptInChecker(), False, True)
                after.consent = result in (ConsentCheckResult.ACCEPTED, ConsentCheckResult.NO_FILE)


def _instance(telemetry_class: type) -> Any:
    """The shared telemetry object, if one was made (the package keeps it on its singleton metaclass)."""
    return getattr(telemetry_class, "_SingletonMetaClass__single_instance", None)


def import_openvino() -> Any:
    """The ``openvino`` module, imported with its telemetry held off (importing its converter sends an event).

    Example:
        >>> import importlib.util
        >>> importlib.util.find_spec("openvino") is None or hasattr(import_openvino(), "Core")
        True
    """
    with vendor_telemetry_held_off():
        import openvino
    return openvino

"""What a batch shape costs on this machine, before the work: one forward estimated from a small timed one.

Every command that runs a model many times over one batch shape (``compress``'s latency table, Fisher
pass and candidates; ``bench``'s rounds; ``export --data``'s judging) asks here first:

1. :func:`forward_cost` times the model (PyTorch, under ``inference_mode``, the threads in use) on a
   full-length random batch at the asked batch size and a short length, doubled until one forward
   takes at least :data:`PROBE_SECONDS` or the asked length is reached (so the timed point is
   compute-bound, not Python overhead, and nothing long is run to find out that it is long);
2. the FLOPs of one sequence follow ``a * L + b * L**2`` exactly for an encoder (projections and FFN
   grow with the length, attention scores with its square): two FLOP counts at short lengths
   (:func:`surgery.measure.flops.count_flops`) give ``a`` and ``b``;
3. the forward at any batch x length is the timed one scaled by the FLOP ratio.

:func:`cap_length` turns that into a decision: a job of ``forwards`` forwards whose estimate exceeds
``max_seconds`` (default :data:`MAX_JOB_SECONDS`) gets the longest length (a multiple of 8) that
fits, and a message saying what was capped, the estimate, and which flag asks for more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from surgery.measure.flops import count_flops
from surgery.measure.timing import make_inputs, time_once, torch_threads

#: A timed probe forward at least this long is compute-bound enough to extrapolate from.
PROBE_SECONDS = 0.25
#: A probe forward this long is used whatever its growth; each doubling must grow the time this much
#: (on a loaded machine a short forward's time is the scheduler's, not the model's).
CEILING_SECONDS, GROWTH = 1.0, 1.5
#: The shortest length probed (and the shortest a cap goes to).
SHORTEST = 16
#: Lengths are capped to multiples of this (padded shapes kernels like; the data's lengths round alike).
MULTIPLE = 8
#: A job estimated beyond this on this machine, without the user asking for it, is beyond reason.
MAX_JOB_SECONDS = 2 * 3600.0


@dataclass(frozen=True)
class ForwardCost:
    """One forward's time at a measured point, and how FLOPs grow with the length, to extrapolate.

    ``flops_linear`` and ``flops_square`` are one sequence's FLOPs per token and per squared token.

    Example:
        >>> cost = ForwardCost(batch=2, seq_len=64, seconds=0.5, flops_linear=1e6, flops_square=1e3)
        >>> round(cost.seconds_at(4, 64), 3), cost.seconds_at(2, 128) > 2 * cost.seconds
        (1.0, True)
    """

    batch: int
    seq_len: int
    seconds: float
    flops_linear: float
    flops_square: float

    def sequence_flops(self, seq_len: int) -> float:
        """FLOPs of one sequence of ``seq_len`` tokens."""
        return self.flops_linear * seq_len + self.flops_square * seq_len ** 2

    def seconds_at(self, batch: int, seq_len: int) -> float:
        """Estimated seconds of one forward at ``batch`` x ``seq_len`` on this machine."""
        measured = self.batch * self.sequence_flops(self.seq_len)
        return self.seconds * batch * self.sequence_flops(seq_len) / max(measured, 1.0)

    def longest(self, batch: int, seconds: float, upto: int) -> int:
        """The longest length (a multiple of :data:`MULTIPLE`, at most ``upto``) whose forward fits ``seconds``."""
        lo, hi = SHORTEST // MULTIPLE, max(upto // MULTIPLE, SHORTEST // MULTIPLE)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.seconds_at(batch, mid * MULTIPLE) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return min(upto, lo * MULTIPLE)


def _flop_fit(model: nn.Module, vocab: int, lengths: tuple[int, int]) -> tuple[float, float]:
    """``a`` and ``b`` of ``flops(L) = a L + b L²`` for one sequence, from two counts."""
    (l1, l2) = lengths
    f1, f2 = (float(count_flops(model, make_inputs(vocab, batch_size=1, seq_len=n))) for n in lengths)
    square = max((f2 / l2 - f1 / l1) / (l2 - l1), 0.0)
    linear = max(f1 / l1 - square * l1, 1.0)
    return linear, square


def forward_cost(model: nn.Module, batch: int, seq_len: int, *, threads: int | None = None,
                 least: float = PROBE_SECONDS) -> ForwardCost:
    """Time ``model`` at ``batch`` x a short length (doubled until a forward takes ``least`` s and grows with the
    length, or takes :data:`CEILING_SECONDS`) and fit its FLOPs.

    Runs a few short forwards (two per length: the first call at a shape is slower): a length whose
    forward would take minutes is never run.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> cost = forward_cost(tiny_model(TinySpec("bert")), 4, 64, least=0.001)
        >>> cost.batch, cost.seq_len <= 64, cost.seconds_at(4, 64) > 0
        (4, True, True)
    """
    vocab = int(getattr(model.config, "vocab_size", 2))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch_threads(threads):
            fit = _flop_fit(model, vocab, (SHORTEST, 2 * SHORTEST))
            length, previous = min(seq_len, 4 * SHORTEST), None
            while True:
                # One untimed call first: the first call at a shape prepares its kernels (2.4x slower here).
                seconds = time_once(model, make_inputs(vocab, batch_size=batch, seq_len=length, device=device))
                # Stop once the time is long enough and grows with the length (compute, not overhead or
                # load, decides it), or is long in itself, or the asked length is reached.
                grew = previous is not None and seconds >= GROWTH * previous
                if (seconds >= least and grew) or seconds >= CEILING_SECONDS or length >= seq_len:
                    break
                previous = seconds
                length = min(seq_len, 2 * length)
    finally:
        model.train(was_training)
    return ForwardCost(batch=batch, seq_len=length, seconds=seconds, flops_linear=fit[0], flops_square=fit[1])


@dataclass(frozen=True)
class LengthCap:
    """What :func:`cap_length` decided: the length to use, whether it was capped, and the message to print."""

    seq_len: int
    capped: bool
    estimated_seconds: float
    asked_seconds: float
    message: str | None


def cap_length(cost: ForwardCost, *, batch: int, seq_len: int, forwards: float, what: str, ask_more: str,
               max_seconds: float = MAX_JOB_SECONDS, given: bool = False, budget: bool = False) -> LengthCap:
    """Cap ``seq_len`` so that ``forwards`` forwards of ``batch`` x it fit ``max_seconds`` here; say so.

    ``given``: the user asked for this length explicitly; it is kept, and the message only warns.
    ``budget``: ``max_seconds`` is the user's budget, which scales the job's phases down to fit (the message
    says so rather than suggesting a budget).
    ``ask_more`` says how to ask for more (e.g. ``"--max-length 8192"``).

    Example:
        >>> cost = ForwardCost(batch=32, seq_len=64, seconds=0.5, flops_linear=1e6, flops_square=1e4)
        >>> cap = cap_length(cost, batch=32, seq_len=8192, forwards=300, what="compress", ask_more="--max-length 8192")
        >>> cap.capped, cap.seq_len < 8192, cap.message.split(":")[0]
        (True, True, 'compress')
        >>> cap_length(cost, batch=32, seq_len=64, forwards=300, what="compress", ask_more="").capped
        False
    """
    asked = cost.seconds_at(batch, seq_len) * forwards
    if asked <= max_seconds:
        return LengthCap(seq_len, False, asked, asked, None)
    per_forward = cost.seconds_at(batch, seq_len)
    head = (f"{what}: a forward of batch {batch} x {seq_len} tokens is estimated at {per_forward:,.1f} s on this "
            f"machine, and the job runs about {forwards:,.0f} of them: {_duration(asked)}")
    if given:
        advice = ("the budget scales the phases down to fit it; a shorter length leaves more of the work in" if budget
                  else "a shorter length or a --budget makes it faster")
        return LengthCap(seq_len, False, asked, asked, f"{head}; running as asked (beyond "
                         f"{_duration(max_seconds)}: {advice})")
    capped = cost.longest(batch, max_seconds / forwards, seq_len)
    estimated = cost.seconds_at(batch, capped) * forwards
    return LengthCap(capped, True, estimated, asked,
                     f"{head}, beyond {_duration(max_seconds)}: texts capped at {capped} tokens ({_duration(estimated)}"
                     f"); pass {ask_more} to ask for more")


def _duration(seconds: float) -> str:
    """``seconds`` as a short phrase: ``about 3.2 h``, ``about 12 min``, ``about 40 s``."""
    if not math.isfinite(seconds):
        return "without end"
    if seconds >= 5400:
        return f"about {seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds:.0f} s"

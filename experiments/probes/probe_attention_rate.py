"""FLOP rate of CPU attention against a dense matmul of MiniLM's shapes (why DoE falls short of its FLOP bound).

After DoE removes most FFN neurons, attention dominates the time left. ``scaled_dot_product_attention``
over short sequences runs at a much lower FLOP rate than the large projections, and the FLOP bound
counts both at the same rate. This probe times both shapes of the DoE benchmark (batch 32, 64 + 20
prompt tokens, 12 heads of 32) interleaved, one thread, and prints GFLOP/s.

    python experiments/probes/probe_attention_rate.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def main(repeats: int = 30) -> None:
    torch.set_num_threads(1)
    batch, tokens, heads, head_dim = 32, 84, 12, 32
    hidden = heads * head_dim
    q, k, v = (torch.randn(batch, heads, tokens, head_dim) for _ in range(3))
    x = torch.randn(batch * tokens, hidden)
    w = torch.randn(hidden, hidden)
    work = {
        "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), 4 * batch * heads * tokens**2 * head_dim),
        "matmul": (lambda: F.linear(x, w), 2 * batch * tokens * hidden * hidden),
    }
    times: dict[str, list[float]] = {name: [] for name in work}
    with torch.inference_mode():
        for _ in range(3):
            for fn, _flops in work.values():
                fn()
        for _ in range(repeats):
            for name, (fn, _flops) in work.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    rates = {name: work[name][1] / statistics.median(t) / 1e9 for name, t in times.items()}
    for name, rate in rates.items():
        print(f"{name:7s} {1e3 * statistics.median(times[name]):7.2f} ms  {rate:6.1f} GFLOP/s")
    print(f"matmul / sdpa FLOP rate: {rates['matmul'] / rates['sdpa']:.1f}x")


if __name__ == "__main__":
    main()

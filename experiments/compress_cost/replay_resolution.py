"""How many `--max-drop` bisection points a resolution in predicted speed leaves out, replayed on recorded runs.

Each `--max-drop 1` row of the experiments/deep_cuts results named below lists its candidates in the order they
were built. Per path (``path``, ``units-path``, ``uniform-path``) the replay walks its bisection points in that
order, keeps the bracket as the search kept it (a point within the drop raises the lower end, one beyond lowers the
upper end), and counts the points built after the bracket's two ends were within ``resolution`` of each other in
predicted speed. The upper end's speed is read from the probe that set it (one step further along the path), so
the count is a slight underestimate of what the rule saves. Points past the bracket (the extra candidates of the
pick) end a path's walk.

    python experiments/compress_cost/replay_resolution.py 0.03 0.05 0.02
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "deep_cuts" / "results"
FILES = ("deep_cuts_zen4_s19_maxdrop.json", "deep_cuts_zen5_s17_maxdrop.json", "deep_cuts_zen5_s16_maxdrop.json")
PATHS = (("path", "path-"), ("units-path", "units-"), ("uniform-path", "uniform-"))


def replay(row: dict, resolution: float, max_drop: float = 1.0) -> tuple[int, int]:
    """(bisection points built, points the resolution would have left out) of one recorded run."""
    built = saved = 0
    for origin, prefix in PATHS:
        lo, lo_speed, hi, hi_speed, stopped = 0, row["unchanged_speedup"] or 1.0, 10**9, None, False
        for c in (c for c in row["candidates"] if c["name"].startswith(prefix) and c.get("origin") == origin):
            k, speed = c["path_step"], c["predicted_speedup"]
            if not lo < k <= hi:
                break
            built += 1
            stopped = stopped or (hi_speed is not None and hi_speed <= lo_speed * (1 + resolution))
            if stopped:
                saved += 1
            elif c["drop"] <= max_drop:
                lo, lo_speed = k, speed
            else:
                hi, hi_speed = k - 1, speed
    return built, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("resolutions", type=float, nargs="+")
    args = parser.parse_args()
    rows = [row for name in FILES for key, row in json.loads((RESULTS / name).read_text())["runs"].items()
            if "max-drop" in key]
    for resolution in args.resolutions:
        counts = [replay(row, resolution) for row in rows]
        print(f"resolution {resolution:.0%}: {len(rows)} runs, {sum(b for b, _ in counts)} bisection points, "
              f"{sum(s for _, s in counts)} left out")


if __name__ == "__main__":
    main()

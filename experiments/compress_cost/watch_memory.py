"""Where a long ``surgery compress`` run holds its memory: RSS of its processes sampled, Python stacks at thresholds.

Every ``--every`` seconds it writes one line: the time, each process's RSS (the ``surgery compress`` process and
its spawned workers) and the last progress line of the run's stderr log. The first time the main process
passes each of ``--dump-at`` GB it writes that process's Python stack (``py-spy dump``, where py-spy is
installed: pip install py-spy), which names the call that holds the memory. ``--kill-at`` GB stops the run
before the kernel's OOM killer would (exit 137 either way; the machine stays usable). It ends two minutes
after the run's processes are gone.

    python experiments/compress_cost/run_cost.py --work W --seq-len 512 --join 18 --budget 30 --name N &
    python experiments/compress_cost/watch_memory.py --stderr-log W/N.stderr.log --log N.mem.log --kill-at 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

GIB = 2**30


def processes() -> list[tuple[int, int, str]]:
    """(pid, RSS bytes, command line) of the ``surgery compress`` process and of spawned worker processes."""
    rows = subprocess.run(["ps", "-eo", "pid,rss,args"], capture_output=True, text=True, check=False).stdout
    out = []
    for line in rows.splitlines()[1:]:
        pid, rss, args = line.split(None, 2)
        if ("bin/surgery compress" in args and "time -v" not in args) or "multiprocessing.spawn" in args:
            out.append((int(pid), int(rss) * 1024, args))
    return out


def last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    return next((line[:160] for line in reversed(lines) if line.strip()), "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stderr-log", type=Path, required=True, help="the run's stderr log (run_cost.py's)")
    parser.add_argument("--log", type=Path, required=True, help="where the samples and stacks go")
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--dump-at", type=float, nargs="*", default=[6, 9, 12, 15, 18, 20])
    parser.add_argument("--kill-at", type=float, default=None, help="GB of the main process that stop the run")
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    dumped: set[tuple[int, float]] = set()
    started, seen = time.time(), time.time()
    with args.log.open("a", buffering=1) as log:
        while time.time() - seen < 120:
            found = processes()
            if found:
                seen = time.time()
            sizes = " ".join(f"{pid}:{rss / GIB:.2f}G" for pid, rss, _ in found)
            log.write(f"{time.strftime('%H:%M:%S')} {sizes} | {last_line(args.stderr_log)}\n")
            for pid, rss, command in found:
                if "bin/surgery compress" not in command:
                    continue
                for gb in args.dump_at:
                    if rss > gb * GIB and (pid, gb) not in dumped and spy:
                        dumped.add((pid, gb))
                        stack = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                               check=False)
                        log.write(f"=== py-spy at {gb:g} GB pid {pid}\n{stack.stdout}{stack.stderr}\n")
                if args.kill_at is not None and rss > args.kill_at * GIB:
                    log.write(f"=== stopped {pid} at {rss / GIB:.2f} GB (--kill-at {args.kill_at:g})\n")
                    os.kill(pid, signal.SIGKILL)
            time.sleep(args.every)
    print(f"watched {time.time() - started:.0f} s: {args.log}")


if __name__ == "__main__":
    main()

"""Peak resident memory of a command, and what it was doing when it peaked.

Runs the command, samples its resident memory (``VmRSS``, the process and its children) every
``--every`` seconds and reads its stderr as it comes (a run's progress: phases, bars), then
prints the peak (``getrusage``'s max RSS of the largest process, what ``/usr/bin/time -v``
reports) with the last stderr line before the sampled peak, and the sampled peak within each
phase named by ``--mark`` (a regular expression on stderr lines). The last line of stdout is
one JSON line with every figure.

    PYTHONPATH=src .venv/bin/python scripts/memory_trace.py -- \
        python -m bidswarm.train model=smollm2_135m debug=smoke logger=csv
    ... --trace trace.tsv     # every sample: seconds, GiB, the last stderr line
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 2**30


def mark_name(line: str) -> str:
    """A phase's name from the line that starts it: a progress bar's description (the text
    before its first colon), else the line's start."""
    return line.split(":", 1)[0][:60] if "|" in line else line[:80]


def rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (0 once it is gone)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        stack += [int(child) for child in children]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--trace", type=Path, default=None, help="write every sample here")
    parser.add_argument(
        "--mark",
        default=r"^\[bidswarm\]|SFT|update|held-out|evaluat",
        help="stderr lines that start a phase (a regular expression)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    mark = re.compile(args.mark)
    started = time.perf_counter()
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    last = {"line": "(start)", "phase": "(start)"}

    def read_stderr() -> None:
        # tqdm redraws its line after a carriage return, without a newline: both end a line.
        pending = ""
        while chunk := process.stderr.read1(4096).decode(errors="replace"):
            sys.stderr.write(chunk)
            *lines, pending = re.split(r"[\r\n]", pending + chunk)
            for line in (line.strip() for line in lines):
                if line:
                    last["line"] = line[:160]
                    if mark.search(line):
                        last["phase"] = mark_name(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    samples: list[tuple[float, int, str]] = []
    phases: dict[str, int] = {}
    while process.poll() is None:
        rss = rss_bytes(process.pid)
        samples.append((time.perf_counter() - started, rss, last["line"]))
        phases[last["phase"]] = max(phases.get(last["phase"], 0), rss)
        time.sleep(args.every)
    reader.join(timeout=5)
    wall = time.perf_counter() - started
    max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    peak = max(samples, key=lambda sample: sample[1]) if samples else (0.0, 0, "")
    if args.trace is not None:
        args.trace.write_text(
            "".join(f"{t:.2f}\t{rss / GIB:.3f}\t{line}\n" for t, rss, line in samples)
        )
    print(f"exit {process.returncode}, {wall:.0f} s", file=sys.stderr)
    print(f"peak RSS (getrusage) {max_rss / GIB:.2f} GiB", file=sys.stderr)
    print(f"sampled peak {peak[1] / GIB:.2f} GiB at {peak[0]:.0f} s, after: {peak[2]}")
    for phase, rss in phases.items():
        print(f"  {rss / GIB:6.2f} GiB  {phase}")
    print(
        json.dumps(
            {
                "returncode": process.returncode,
                "wall_s": wall,
                "peak_rss_gib": max_rss / GIB,
                "sampled_peak_gib": peak[1] / GIB,
                "sampled_peak_at_s": peak[0],
                "sampled_peak_after": peak[2],
                "phase_peaks_gib": {phase: rss / GIB for phase, rss in phases.items()},
            }
        )
    )
    sys.exit(process.returncode)


if __name__ == "__main__":
    main()

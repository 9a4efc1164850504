"""``sharebert serve``'s resident memory while stalled connections hold large request bodies, the version before
``--max-buffered-bytes`` beside today's, in one run.

Starts ``sharebert serve`` (a subprocess on 127.0.0.1, default limits unless given after ``--``) and, with
``--before DIR``, a second one from an older runtime (DIR holds its ``sharebert_runtime``: ``git archive REV deploy |
tar -x -C DIR && mv DIR/deploy DIR/sharebert_runtime``). For each server in turn: its RSS idle, then for
``--seconds`` ``ADDRESSES x PER`` connections (loopback addresses 127.0.0.2, .3, ...; default 8 x 32, the default
``--max-connections``) that each send a ``POST`` declaring ``--body`` bytes (default the default
``--max-body-bytes``, 1 MiB), all of it but its last byte, and stall, reconnecting as soon as the server closes
them; meanwhile one client from 127.0.0.1 sends a one-sentence ``POST /fill-mask`` and a ``GET /health`` back to
back. The server's ``VmRSS`` is read from ``/proc`` every 0.1 s: the table gives its idle and peak RSS, the peak
over idle, and the statuses the well-behaved client got.

    OMP_NUM_THREADS=1 python benchmarks/serve_buffered_bytes.py --before /tmp/oldrt
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import HOST, Server, ensure_artifact  # noqa: E402
from serve_slow_clients import BODY, _call  # noqa: E402


def rss_mb(pid: int) -> float:
    """The process's resident set size now, in MB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Holders:
    """``addresses`` x ``per`` threads, each keeping one connection that sent all of a ``body``-byte request but its
    last byte; a connection the server closes (its header deadline, or a 503) is opened again at once."""

    def __init__(self, port: int, addresses: int, per: int, body: int):
        self.port, self.stop = port, threading.Event()
        head = f"POST /fill-mask HTTP/1.1\r\nHost: x\r\nContent-Length: {body}\r\n\r\n".encode()
        self.request = head + b"x" * (body - 1)
        self.opened = Counter()
        self.threads = [
            threading.Thread(target=self._hold, args=(f"127.0.0.{2 + a}",), daemon=True)
            for a in range(addresses)
            for _ in range(per)
        ]
        for t in self.threads:
            t.start()

    def _hold(self, address: str) -> None:
        while not self.stop.is_set():
            with socket.socket() as s:
                try:
                    s.bind((address, 0))
                    s.settimeout(1.0)
                    s.connect((HOST, self.port))
                    self.opened[address] += 1
                    s.sendall(self.request)
                    while not self.stop.is_set():  # until the server closes it (EOF or a reset)
                        try:
                            if not s.recv(65536):
                                break
                        except TimeoutError:
                            continue
                except OSError:
                    time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def measure(server: Server, seconds: float, addresses: int, per: int, body: int) -> dict:
    """Idle RSS, then the peak RSS and the well-behaved client's statuses while the holders run."""
    _call(server.port, "POST", "/fill-mask", BODY)  # warm-up: the first request's allocations
    time.sleep(1.0)
    idle = rss_mb(server.proc.pid)
    holders = Holders(server.port, addresses, per, body)
    peak, posts, health = idle, Counter(), Counter()
    sampling = threading.Event()

    def sample():
        nonlocal peak
        while not sampling.is_set():
            peak = max(peak, rss_mb(server.proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            posts[_call(server.port, "POST", "/fill-mask", BODY)[0]] += 1
            health[_call(server.port, "GET", "/health", None)[0]] += 1
            time.sleep(0.05)
    finally:
        holders.close()
        sampling.set()
        sampler.join()
    return {"idle": idle, "peak": peak, "posts": posts, "health": health, "opened": sum(holders.opened.values())}


def _statuses(counts: Counter) -> str:
    return ", ".join(f"{n} x {status or 'error'}" for status, n in sorted(counts.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, help="a fill-mask artifact (default: sharebert-tiny, as serve_load's)")
    ap.add_argument("--hold", default="8x32", help="ADDRESSESxPER connections holding a body (default: 8x32)")
    ap.add_argument("--body", type=int, default=1 << 20, help="bytes each declares (default: 1 MiB)")
    ap.add_argument("--seconds", type=float, default=12.0, help="how long they hold (default: 12)")
    ap.add_argument("--before", type=Path, help="a folder holding an older sharebert_runtime to run beside")
    ap.add_argument("limits", nargs="*", help="after --: more `sharebert serve` options")
    args = ap.parse_args(argv)
    addresses, per = map(int, args.hold.split("x"))
    artifact = args.artifact or ensure_artifact("sharebert-tiny", "none")
    variants = {"now": {}} | (
        {"before": {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(args.before)}} if args.before else {}
    )
    rows = {}
    for name, env in variants.items():  # one at a time: the holders' load is on one server only
        server = Server(artifact, 0, "auto", 1, args.limits, env)
        try:
            server.wait_healthy(300)
            rows[name] = measure(server, args.seconds, addresses, per, args.body)
        finally:
            server.proc.terminate()
            server.proc.wait(timeout=30)
        print(f"{name}: {rows[name]}", file=sys.stderr)
    print(f"\n{addresses} x {per} connections each holding {args.body - 1} of {args.body} body bytes, {args.seconds} s")
    print("\n| server | RSS idle MB | RSS peak MB | peak - idle MB | connections opened | POST /fill-mask | /health |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['idle']:.0f} | {r['peak']:.0f} | {r['peak'] - r['idle']:.0f} | {r['opened']} | "
            f"{_statuses(r['posts'])} | {_statuses(r['health'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

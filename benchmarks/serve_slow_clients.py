"""A well-behaved client's latency on ``sharebert serve`` with an idle server beside the same server holding many
stalled connections, in one run (the bar of issue 47: p50 within 2x).

Starts ``sharebert serve`` (a subprocess on 127.0.0.1, default limits unless given after ``--``), then alternates
phases of ``--seconds`` each, ``--rounds`` times: ``idle`` (nothing else connected) and one phase per ``--stall``
load ``ADDRESSESxPER``: that many loopback addresses (127.0.0.2, .3, ...) each holding PER connections that stall,
half after an unfinished header block, half after whole headers and one body byte, reconnecting as soon as the
server closes one (its ``--header-timeout``). Through every phase one client from 127.0.0.1 sends, one after the
other, a new connection each, ``POST /fill-mask`` of one sentence and ``GET /health``; each phase's answers are
counted by status, and the table gives the p50 and p95 of the POSTs per load, their ratio to the idle p50, and the
share of /health probes answered 200. ``--before DIR`` starts a second server from an older runtime beside it (DIR
holds its ``sharebert_runtime``: ``git archive REV deploy | tar -x -C DIR && mv DIR/deploy DIR/sharebert_runtime``),
each phase running on both in turn.

    OMP_NUM_THREADS=1 python benchmarks/serve_slow_clients.py --stall 4x32 --stall 4x50 --stall 100x2
    OMP_NUM_THREADS=1 python benchmarks/serve_slow_clients.py --artifact A -- --header-timeout 2
    OMP_NUM_THREADS=1 python benchmarks/serve_slow_clients.py --before /tmp/oldrt     # the version before beside
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import HOST, Server, ensure_artifact  # noqa: E402

STALL_BYTES = (  # what a stalled connection sends before it stops
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n",
    b"POST /fill-mask HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
)
BODY = json.dumps({"text": "the [MASK] sat on the mat .", "top_k": 2})


class Stallers:
    """``addresses`` x ``per`` stalled connections, each replaced as soon as the server closes it (one thread)."""

    def __init__(self, port: int, addresses: int, per: int):
        self.port, self.stop = port, threading.Event()
        self.slots = [(f"127.0.0.{2 + a}", i) for a in range(addresses) for i in range(per)]
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self, slot) -> socket.socket | None:
        s = socket.socket()
        try:
            s.bind((slot[0], 0))
            s.connect((HOST, self.port))
            s.sendall(STALL_BYTES[slot[1] % 2])
            return s
        except OSError:
            s.close()
            return None

    def _run(self) -> None:
        socks = {slot: self._open(slot) for slot in self.slots}
        while not self.stop.is_set():
            live = {s: slot for slot, s in socks.items() if s is not None}
            readable = select.select(list(live), [], [], 0.2)[0] if live else []
            for s in readable:  # the server answered (a 408 or 503) and closes it: read, close, stall anew
                try:
                    if s.recv(65536):
                        continue
                except OSError:
                    pass
                s.close()
                socks[live[s]] = None
            for slot, s in socks.items():
                if s is None and not self.stop.is_set():
                    socks[slot] = self._open(slot)
                    self.reconnects += 1
        for s in socks.values():
            if s is not None:
                s.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _call(port: int, method: str, path: str, body: str | None) -> tuple[int, float]:
    """(status, seconds) of one request on a new connection; status 0 for a connection error."""
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status, time.perf_counter() - t0
    except OSError:
        return 0, time.perf_counter() - t0


def phase(port: int, seconds: float) -> tuple[list[float], Counter, Counter]:
    """Requests back to back for ``seconds``: the POSTs' latencies, their statuses and /health's statuses."""
    latencies, posts, health = [], Counter(), Counter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        status, took = _call(port, "POST", "/fill-mask", BODY)
        posts[status] += 1
        if status == 200:
            latencies.append(took)
        health[_call(port, "GET", "/health", None)[0]] += 1
    return latencies, posts, health


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, help="a fill-mask artifact (default: sharebert-tiny, as serve_load's)")
    ap.add_argument("--stall", action="append", help="ADDRESSESxPER stalled connections (repeatable; default 4x32)")
    ap.add_argument("--seconds", type=float, default=8.0, help="each phase's length (default: 8)")
    ap.add_argument("--rounds", type=int, default=3, help="times every phase runs, alternating (default: 3)")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of the server (default: 1)")
    ap.add_argument("--before", type=Path, help="a folder holding an older sharebert_runtime to run beside")
    ap.add_argument("limits", nargs="*", help="after --: more `sharebert serve` options")
    args = ap.parse_args(argv)
    loads = [tuple(map(int, s.split("x"))) for s in args.stall or ["4x32"]]
    artifact = args.artifact or ensure_artifact("sharebert-tiny", "none")
    variants = {"now": {}} | (
        {"before": {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(args.before)}} if args.before else {}
    )
    servers = {name: Server(artifact, 0, "auto", args.threads, args.limits, env) for name, env in variants.items()}
    phases = [("idle", None), *((f"{a}x{p}", (a, p)) for a, p in loads)]
    results = {(v, name): ([], Counter(), Counter()) for v in servers for name, _ in phases}
    try:
        for server in servers.values():
            server.wait_healthy(300)
            phase(server.port, 1.0)  # warm-up
        for r in range(args.rounds):
            for name, load in phases:
                for variant, server in servers.items():
                    _run_phase(server.port, load, args.seconds, results[variant, name], f"{r + 1} {variant} {name}")
    finally:
        for server in servers.values():
            server.proc.terminate()
            server.proc.wait(timeout=30)
    print("\n| server | load | POSTs answered 200 | p50 ms | p95 ms | p50 / idle p50 | /health 200 |")
    print("|---|---|---|---|---|---|---|")
    for (variant, name), (lat, posts, health) in results.items():
        p50, p95 = (1e3 * np.percentile(lat, q) for q in (50, 95)) if lat else (float("nan"),) * 2
        idle_p50 = 1e3 * np.median(results[variant, "idle"][0])
        print(
            f"| {variant} | {name} | {posts[200]} of {sum(posts.values())} | {p50:.1f} | {p95:.1f} | "
            f"{p50 / idle_p50:.2f} | {health[200]} of {sum(health.values())} |"
        )
    return 0


def _run_phase(port: int, load, seconds: float, into: tuple, label: str) -> None:
    """One phase on the server at ``port``: with ``load`` = (addresses, per) stalled connections, or idle."""
    stallers = Stallers(port, *load) if load else None
    time.sleep(0.5 if load else 0)  # their connections open
    lat, posts, health = phase(port, seconds)
    reconnects = stallers.reconnects if stallers else 0
    if stallers:
        stallers.close()
        time.sleep(0.5)  # their connections closed before the next phase
    into[0].extend(lat)
    into[1].update(posts)
    into[2].update(health)
    p50 = f"{1e3 * np.median(lat):.1f} ms" if lat else "-"
    print(
        f"{label}: {len(lat)} answered, p50 {p50}, POST {dict(posts)}, /health {dict(health)}, "
        f"stalled reconnected {reconnects}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())

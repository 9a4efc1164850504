"""Bounded load test of ``sharebert serve`` on 127.0.0.1: throughput, latency percentiles, correctness, peak RSS.

Starts ``python -m sharebert serve ARTIFACT`` as a subprocess on a loopback port, waits for ``/health``,
then ``--clients`` threads (one keep-alive ``http.client`` connection each) POST ``/fill-mask`` requests
of ``--batch`` SST-2 dev sentences with one ``[MASK]`` each until ``--duration`` seconds or
``--requests`` requests, whichever comes first. Every answer is checked against
:class:`sharebert_runtime.Runtime` run in this process on the same artifact, RAM mode and batch: the
top-1 token of every ``[MASK]`` must match (the correctness criterion; scores can move in the last
bits with the thread count, and with ``--ram int8`` the activation scales depend on the whole batch,
which is why the reference is computed on exactly the batches sent). The largest score difference is
printed too. The server is always stopped at the end (also on Ctrl-C or an error); its peak RSS is
read from ``/proc/<pid>/status`` (VmHWM) just before.

Without ``--artifact`` a random-weight ``--preset`` model is built and exported compact ``--quantize``
under ``artifacts/serve_bench/`` (reused when present; the figures are about time, not accuracy).

    python benchmarks/serve_load.py --preset sharebert-tiny --duration 10          # quick check
    python benchmarks/serve_load.py --clients 4 --duration 60 --ram int8            # sharebert-small
    python benchmarks/serve_load.py --preset sharebert-tiny --quantize none --clients 80 --hostile 20 \
        --duration 20 --threads 1 --max-memory 990                                  # hostile mix, 100 clients
    python benchmarks/serve_load.py --preset sharebert-tiny --quantize none --clients 80 --hostile 20 \
        --dribblers 130 --duration 60 --threads 1                                   # and 130 slow dribblers
    python benchmarks/serve_load.py --preset sharebert-tiny --quantize none --mixes 80+0,80+20,8+20 \
        --duration 20 --threads 1                       # light p95 / unloaded p95 of each mix, in one run
    python benchmarks/serve_load.py --preset sharebert-tiny --quantize none --mixes 80+0,80+20 \
        --duration 20 --threads 1 --variant="" --variant="--workers 3"    # two servers side by side
    python benchmarks/serve_load.py ... --variant="PYTHONSAFEPATH=1 PYTHONPATH=/tmp/old" \
        --variant=""                                                    # an older version beside

Before each load, one client alone sends ``--unloaded`` requests: their p95 is the unloaded p95 the
loaded one is compared with (goal: loaded p95 <= 10x unloaded, light requests not starved by heavy
ones). ``--mixes`` runs several loads (plain + hostile clients) in turn; with ``--variant`` given more than once,
each mix runs on every variant's server in turn (servers started side by side), so the shared machine's
drift hits them alike; a table of the ratios ends the output. An older version as a variant: its tree made
importable (``git archive OLD | tar -x -C /tmp/old``, then ``ln -s ../deploy /tmp/old/sharebert/deploy`` and
``ln -s ../export /tmp/old/sharebert/export``: the installed package maps those folders). ``--dribblers`` connections
from 127.0.0.2 each send one header line every 5 s, forever (the server's whole-request deadline cuts them off; they
reconnect), while a probe from 127.0.0.1 asks ``GET /health`` twice a second: every probe must get 200.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path

import numpy as np

HOST = "127.0.0.1"
ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=.*")  # a --variant word that sets the server's environment
BENCH_DIR = Path("artifacts/serve_bench")


def masked_sentences(limit: int) -> list[str]:
    """Up to ``limit`` SST-2 dev sentences of 6+ words with their middle word replaced by ``[MASK]``."""
    from sharebert.formats.paths import data_path

    path = data_path("glue", "SST-2", "dev.tsv")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (set SHAREBERT_DATA to the shared data folder)")
    out = []
    for row in path.read_text(encoding="utf-8").splitlines()[1:]:
        words = row.split("\t")[0].split()
        if len(words) >= 6:
            words[len(words) // 2] = "[MASK]"
            out.append(" ".join(words))
        if len(out) == limit:
            break
    return out


def ensure_artifact(preset: str, quantize: str) -> Path:
    """A fill-mask artifact of a random-weight ``preset`` model, built and exported once (torch needed here only)."""
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model

    model, art = BENCH_DIR / f"{preset}-model", BENCH_DIR / f"{preset}-{quantize}"
    if not (art / "manifest.json").is_file():
        if not (model / "config.json").is_file():
            print(f"building {preset} -> {model}", flush=True)
            build_model(preset, model)
        print(f"exporting compact, quantize {quantize} -> {art}", flush=True)
        export_model(
            model, art, task="fill-mask", weights="compact", quantize=quantize, overwrite=True, check_limit=32, runs=5
        )
    return art


class Server:
    """``sharebert serve`` in a subprocess on 127.0.0.1; stderr is drained (last lines kept for errors)."""

    def __init__(
        self,
        artifact: Path,
        port: int,
        ram: str,
        threads: int | None,
        limits: list[str],
        env: dict[str, str] | None = None,
    ):
        cmd = [
            sys.executable,
            "-m",
            "sharebert",
            "serve",
            str(artifact),
            "--host",
            HOST,
            "--port",
            str(port),
            "--ram",
            ram,
            "--quiet",
            *limits,
        ]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        self.log: deque[str] = deque(maxlen=40)
        self.port: int | None = port or None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            found = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
            if found and self.port is None:
                self.port = int(found.group(1))

    def wait_healthy(self, timeout: float) -> float:
        """Seconds from spawn until ``GET /health`` answers 200; raises if the server exits or times out."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n" + "\n".join(self.log))
            if self.port:
                try:
                    conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
                    conn.request("GET", "/health")
                    if conn.getresponse().status == 200:
                        conn.close()
                        return time.perf_counter() - t0
                except OSError:
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n" + "\n".join(self.log))

    def memory_mb(self) -> dict[str, float | None]:
        """VmRSS and VmHWM (peak) of the server process in MB (None once it has exited)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        except OSError:
            status = []
        found = {
            line.split(":")[0]: int(line.split()[1]) / 1024 for line in status if line.startswith(("VmRSS", "VmHWM"))
        }
        return {key: round(found[key], 1) if key in found else None for key in ("VmRSS", "VmHWM")}

    def stop(self) -> str:
        """SIGINT (clean shutdown; ignored when started in the background), then SIGTERM, then SIGKILL."""
        if self.proc.poll() is not None:
            return f"exited by itself with code {self.proc.returncode}"
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
                return f"exit code {self.proc.returncode} after {sig.name}"
            except subprocess.TimeoutExpired:
                continue
        return f"still running after SIGKILL (pid {self.proc.pid})"


class Load:
    """Client threads sharing one request budget; results collected under a lock."""

    def __init__(
        self,
        server: Server,
        requests: list[list[str]],
        expected: list[list[list[int]]],
        expected_scores: list[list[list[float]]],
        deadline_s: float,
        max_requests: int,
        timeout: float,
    ):
        self.server, self.requests, self.expected, self.expected_scores = server, requests, expected, expected_scores
        self.deadline_s, self.max_requests, self.timeout = deadline_s, max_requests, timeout
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sent = 0
        self.latencies: list[float] = []
        self.outcomes: Counter[str] = Counter()
        self.max_score_diff = 0.0
        self.examples: list[str] = []

    def _next(self) -> int | None:
        with self.lock:
            if self.stop.is_set() or self.sent >= self.max_requests or time.perf_counter() >= self.end:
                return None
            self.sent += 1
            return self.sent - 1

    def _record(self, outcome: str, latency: float | None = None, note: str = "", diff: float = 0.0) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if latency is not None:
                self.latencies.append(latency)
            self.max_score_diff = max(self.max_score_diff, diff)
            if note and len(self.examples) < 5:
                self.examples.append(note)

    def _check(self, i: int, reply: dict) -> tuple[bool, float]:
        """Top-1 token ids of every [MASK] equal the in-process ones; also the largest top-1 score difference."""
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != len(self.expected[i]):
            return False, 0.0
        got = [[answers[0]["token_id"] for answers in text] for text in results]
        scores = [[answers[0]["score"] for answers in text] for text in results]
        diff = max((abs(a - b) for s, e in zip(scores, self.expected_scores[i]) for a, b in zip(s, e)), default=0.0)
        return got == self.expected[i], diff

    def client(self) -> None:
        conn = http.client.HTTPConnection(HOST, self.server.port, timeout=self.timeout)
        try:
            while (n := self._next()) is not None:
                i = n % len(self.requests)
                body = json.dumps({"texts": self.requests[i]}).encode("utf-8")
                t0 = time.perf_counter()
                try:
                    conn.request("POST", "/fill-mask", body, {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    payload = response.read()
                except (OSError, http.client.HTTPException) as e:
                    self._record("connection error", note=f"request {n}: {type(e).__name__}: {e}")
                    conn.close()  # http.client reconnects on the next request
                    if self.server.proc.poll() is not None:
                        self.stop.set()  # the server died: no point in hammering a closed port
                    continue
                latency = time.perf_counter() - t0
                if response.status != 200:
                    kind = "5xx" if response.status >= 500 else "4xx" if response.status >= 400 else "other status"
                    self._record(kind, latency, f"request {n}: {response.status} {payload[:200]!r}")
                    continue
                try:
                    ok, diff = self._check(i, json.loads(payload))
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    self._record("malformed answer", latency, f"request {n}: {type(e).__name__}: {e}")
                    continue
                self._record(
                    "correct" if ok else "wrong answer",
                    latency,
                    "" if ok else f"request {n}: top-1 differs from the in-process runtime",
                    diff,
                )
        finally:
            conn.close()

    def run(self, clients: int) -> float:
        """Run ``clients`` threads to the deadline or the request cap; returns the wall time in seconds."""
        t0 = time.perf_counter()
        self.end = t0 + self.deadline_s
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                # a request in flight at the deadline may take up to its timeout
                t.join(max(0.0, self.end - time.perf_counter()) + self.timeout + 5)
        finally:
            self.stop.set()
        return time.perf_counter() - t0


# the heaviest request the default limits allow: 64 texts of 128 tokens (8,192), 3 [MASK] each, top_k 20 (3,840 of the
# 4,096 candidates --max-candidates allows); and one over that budget: every token a [MASK] (161,280 candidates: 413)
HEAVY = json.dumps(
    {"texts": [" ".join(["the"] * 40 + ["[MASK]"] + ["the"] * 41 + ["[MASK]"] * 2 + ["the"] * 42)] * 64, "top_k": 20}
).encode()
OVER_BUDGET = json.dumps({"texts": [" ".join(["[MASK]"] * 126)] * 64, "top_k": 20}).encode()
MALFORMED = [
    b"POST /fill-mask HTTP/1.1\r\nContent-Length: 8000\r\n\r\n" + b"[" * 4000 + b"]" * 4000,
    b'POST /fill-mask HTTP/1.1\r\nContent-Length: 27\r\n\r\n{"text": "a \\ud800 [MASK]"}',
    b"POST /fill-mask HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"\x16\x03\x01\x00\xa5\x01\r\n\r\n",
    b"GET /health HTTP/2.0\r\n\r\n",
    b"GET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n",
]


class Hostile:
    """Threads sending, in turn: a declared 1 GB body (413 expected), a half-sent body left hanging (408),
    a malformed request (4xx), the heaviest allowed request (:data:`HEAVY`: 200, or 503 while another one runs)
    and one over the candidate budget (:data:`OVER_BUDGET`, 64 all-[MASK] texts, top_k 20: 413).
    Outcomes are counted as ``kind status`` ('kind reset' for a connection that got no answer)."""

    KINDS = ("oversize", "slow", "malformed", "heavy", "overbudget")

    def __init__(self, port: int, end: float, timeout: float):
        self.port, self.end, self.timeout = port, end, timeout
        self.outcomes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _exchange(self, kind: str, n: int) -> str:
        import socket

        with socket.create_connection((HOST, self.port), timeout=self.timeout) as s:
            if kind == "oversize":
                s.sendall(b"POST /fill-mask HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n")
            elif kind == "slow":
                s.sendall(b'POST /fill-mask HTTP/1.1\r\nContent-Length: 40\r\n\r\n{"text": ')
            elif kind == "malformed":
                s.sendall(MALFORMED[n % len(MALFORMED)])
            else:
                body = HEAVY if kind == "heavy" else OVER_BUDGET
                s.sendall(
                    b"POST /fill-mask HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                )
            reply = b""
            while not reply.startswith(b"HTTP/1.1 ") or b"\r\n\r\n" not in reply:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                reply += chunk
            if kind == "heavy":  # read the whole answer: its size is part of the memory the server holds
                while s.recv(1 << 20):
                    pass
        return reply[9:12].decode() if reply.startswith(b"HTTP/1.1 ") else "reset"

    def client(self, index: int) -> None:
        n = index
        while time.perf_counter() < self.end:
            kind = self.KINDS[n % len(self.KINDS)]
            try:
                status = self._exchange(kind, n // len(self.KINDS))
            except OSError as e:
                status = f"error {type(e).__name__}"
            with self.lock:
                self.outcomes[f"{kind} {status}"] += 1
            n += 1

    def start(self, clients: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        return threads

    def bad(self) -> dict[str, int]:
        """Outcomes that miss what HTTP says: 5xx, resets, or the wrong status for the kind (a heavy request may
        get 503 + Retry-After: at most workers - 1 of them are admitted at once)."""
        want = {
            "oversize": {"413"},
            "slow": {"408"},
            "malformed": {"400", "404"},
            "heavy": {"200", "503"},
            "overbudget": {"413"},
        }
        return {k: v for k, v in self.outcomes.items() if k.split(" ", 1)[1] not in want[k.split(" ")[0]]}


class Dribblers:
    """``n`` connections from 127.0.0.2 sending one header line every ``pace`` s and never finishing the request;
    one cut off by the server reconnects. A probe from 127.0.0.1 asks ``GET /health`` every 0.5 s."""

    def __init__(self, port: int, end: float, n: int, pace: float = 5.0):
        self.port, self.end, self.n, self.pace = port, end, n, pace
        self.connected = self.peak = self.cut = 0
        self.health: Counter[str] = Counter()
        self.health_ms: list[float] = []
        self.lock = threading.Lock()

    def _drip(self) -> None:
        import socket

        while time.perf_counter() < self.end:
            try:
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.settimeout(10)
                s.connect((HOST, self.port))
                s.sendall(b"GET /health HTTP/1.1\r\n")
            except OSError:
                time.sleep(0.5)
                continue
            with self.lock:
                self.connected += 1
                self.peak = max(self.peak, self.connected)
            try:
                while time.perf_counter() < self.end:
                    time.sleep(self.pace)
                    s.sendall(b"X-Drip: 1\r\n")
            except OSError:
                with self.lock:
                    self.cut += 1
            finally:
                s.close()
                with self.lock:
                    self.connected -= 1

    def _probe(self) -> None:
        while time.perf_counter() < self.end:
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
                conn.request("GET", "/health", headers={"Connection": "close"})
                status = str(conn.getresponse().status)
                conn.close()
            except (OSError, http.client.HTTPException) as e:
                status = f"error {type(e).__name__}"
            with self.lock:
                self.health[status] += 1
                self.health_ms.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.5)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._drip, daemon=True) for _ in range(self.n)]
        threads.append(threading.Thread(target=self._probe, daemon=True))
        for t in threads:
            t.start()
        return threads


def reference(artifact: Path, ram: str, threads: int | None, requests: list[list[str]]):
    """Per request, per text, per [MASK]: the in-process top-1 token id and its score."""
    from sharebert_runtime import Runtime

    runtime = Runtime(artifact, threads=threads, ram=ram)
    if runtime.task != "fill-mask":
        raise ValueError(f"{artifact} is a {runtime.task} artifact; this load test sends fill-mask requests")
    ids, scores = [], []
    for texts in requests:
        preds = runtime.fill_mask(texts, top_k=1)
        ids.append([[answers[0]["token_id"] for answers in text] for text in preds])
        scores.append([[answers[0]["score"] for answers in text] for text in preds])
    return ids, scores


def _mixes(text: str) -> list[tuple[int, int]]:
    """``80+0,80+20`` -> ``[(80, 0), (80, 20)]``."""
    try:
        mixes = [tuple(int(n) for n in part.split("+")) for part in text.split(",")]
    except ValueError:
        mixes = []
    if not mixes or any(len(m) != 2 or m[0] < 1 or m[1] < 0 for m in mixes):
        raise argparse.ArgumentTypeError(f"expected CLIENTS+HOSTILE[,...] with CLIENTS >= 1, got {text!r}")
    return mixes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", help="an exported fill-mask artifact (default: build and export --preset)")
    ap.add_argument(
        "--preset", default="sharebert-small", help="model built without --artifact (default: sharebert-small)"
    )
    ap.add_argument(
        "--quantize", default="int8", choices=("none", "int8"), help="export of the built model (default: int8)"
    )
    ap.add_argument("--clients", type=int, default=4, help="concurrent client threads (default: 4)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default: 60)")
    ap.add_argument("--requests", type=int, default=1_000_000, help="hard cap on requests (default: 1e6)")
    ap.add_argument("--batch", type=int, default=1, help="texts per request (default: 1)")
    ap.add_argument("--sentences", type=int, default=256, help="distinct SST-2 sentences, cycled (default: 256)")
    ap.add_argument("--ram", choices=("fp32", "int8"), default="fp32", help="server and reference RAM mode")
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (server and reference)")
    ap.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds (default: 60)")
    ap.add_argument(
        "--hostile",
        type=int,
        default=0,
        help="extra client threads sending oversize, half-sent, malformed and heaviest requests (default: 0)",
    )
    ap.add_argument(
        "--dribblers",
        type=int,
        default=0,
        help="slow clients from 127.0.0.2 dribbling a header line every 5 s (default: 0)",
    )
    ap.add_argument(
        "--unloaded",
        type=int,
        default=50,
        help="requests of one client alone before the load: the unloaded p95 (default: 50)",
    )
    ap.add_argument("--workers", type=int, default=2, help="server --workers (default: 2)")
    ap.add_argument("--max-batch-tokens", type=int, default=1024, help="server --max-batch-tokens (default: 1024)")
    ap.add_argument(
        "--server-timeout", type=int, default=5, help="server --timeout, what a half-sent body waits (default: 5)"
    )
    ap.add_argument(
        "--max-memory",
        type=float,
        default=None,
        help="MB: fail when the server's peak RSS exceeds it (docs/DEVICE.md derives it from the limits)",
    )
    ap.add_argument(
        "--mixes",
        type=_mixes,
        default=None,
        metavar="C+H,...",
        help="load mixes run in turn on one server, e.g. 80+0,80+20,8+20: C plain clients + H hostile ones "
        "(default: --clients + --hostile)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        metavar="OPTIONS",
        help='more `sharebert serve` options for a server, e.g. --variant="--workers 3"; NAME=VALUE words set '
        'its environment (--variant="PYTHONSAFEPATH=1 PYTHONPATH=/old/checkout" runs an older version); '
        "given more than once, every mix runs on each variant's server in turn (default: one server, no more options)",
    )
    args = ap.parse_args(argv)
    if args.clients < 1 or args.batch < 1 or args.requests < 1 or args.duration <= 0 or args.sentences < 1:
        ap.error("--clients, --batch, --requests, --sentences and --duration must be positive")
    if not 0 <= args.port < 65536:
        ap.error("--port must be in [0, 65535]")

    artifact = Path(args.artifact) if args.artifact else ensure_artifact(args.preset, args.quantize)
    sentences = masked_sentences(args.sentences)
    requests = [sentences[i : i + args.batch] for i in range(0, len(sentences) - args.batch + 1, args.batch)]
    if not requests:
        ap.error(f"--batch {args.batch} exceeds the {len(sentences)} sentences available")
    requests = requests[: args.requests]
    print(
        f"reference answers for {len(requests)} distinct requests of {args.batch} text(s), ram {args.ram} ...",
        flush=True,
    )
    expected, expected_scores = reference(artifact, args.ram, args.threads, requests)

    mixes = args.mixes or [(args.clients, args.hostile)]
    variants = args.variant or [""]
    configs = [(v if len(variants) > 1 else "", shlex.split(v)) for v in variants]
    configs = [
        (
            name,
            [w for w in words if not ENV_WORD.fullmatch(w)],  # NAME=VALUE words: the server's environment
            dict(w.split("=", 1) for w in words if ENV_WORD.fullmatch(w)),
        )
        for name, words in configs
    ]
    most = max(c + h for c, h in mixes)
    limits = [
        "--max-batch",
        str(max(64, args.batch)),
        "--workers",
        str(args.workers),
        "--max-batch-tokens",
        str(args.max_batch_tokens),
        "--timeout",
        str(args.server_timeout),
        "--max-queue",
        str(most),
        "--max-connections",
        str(2 * (most + 10)),
        "--max-client-connections",
        str(most + 10),
    ]  # 127.0.0.1's clients; dribblers no more
    servers = [
        (name, Server(artifact, args.port, args.ram, args.threads, limits + extra, env)) for name, extra, env in configs
    ]
    table, ok = [], True
    try:
        for name, server in servers:
            ready_s = server.wait_healthy(timeout=300)
            print(
                f"server {name} pid {server.proc.pid} healthy on {HOST}:{server.port} after {ready_s:.2f} s", flush=True
            )
            Load(server, requests, expected, expected_scores, 30.0, most, args.timeout).run(
                most
            )  # connections, first runs
        for clients, hostile_n in mixes:  # each mix on every server in turn: the machine's drift hits them alike
            for name, server in servers:
                summary = run_mix(args, artifact, server, name, clients, hostile_n, requests, expected, expected_scores)
                ok &= summary.pop("ok")
                table.append((name, clients, hostile_n, summary))
    finally:
        for name, server in servers:
            print(f"server {name} {server.stop()}")
    print("\nlight p95 loaded / unloaded (one-sentence requests, unloaded p95 measured just before; goal <= 10):")
    for name, clients, hostile_n, summary in table:
        heavy = {k: v for k, v in summary["hostile"].items() if k.startswith("heavy")} if hostile_n else None
        print(
            f"  {clients} clients + {hostile_n} hostile{', ' + name if name else ''}: "
            f"p95 {summary['latency_ms']['p95']} ms "
            f"/ unloaded {summary['unloaded_p95_ms']} ms = {summary['p95_over_unloaded']}x "
            f"({summary['answered']} answered, correct rate {summary['correct_rate']}"
            f"{', heavy ' + str(heavy) if hostile_n else ''})"
        )
    return 0 if ok else 1


def run_mix(args, artifact, server, name, clients, hostile_n, requests, expected, expected_scores) -> dict:
    """The unloaded p95 (one client alone), then ``clients`` plain clients + ``hostile_n`` hostile ones (and
    ``--dribblers``) for ``--duration`` s; prints the figures, returns the summary (``ok``: every answer correct,
    no wrong hostile status, memory within ``--max-memory``, /health always 200 beside the dribblers)."""
    alone = Load(server, requests, expected, expected_scores, 60.0, args.unloaded, args.timeout)
    alone.run(1)
    unloaded_p95 = float(np.percentile(np.asarray(alone.latencies) * 1e3, 95)) if alone.latencies else float("nan")
    warm_rss = server.memory_mb()
    load = Load(server, requests, expected, expected_scores, args.duration, args.requests, args.timeout)
    print(
        f"\nload{' (' + name + ')' if name else ''}: {clients} clients, {args.batch} text(s)/request, up to "
        f"{args.duration:g} s or {args.requests} requests; {hostile_n} hostile clients ...",
        flush=True,
    )
    hostile = Hostile(server.port, time.perf_counter() + args.duration, args.timeout)
    hostile_threads = hostile.start(hostile_n)
    dribblers = Dribblers(server.port, time.perf_counter() + args.duration, args.dribblers)
    dribbler_threads = dribblers.start() if args.dribblers else []
    wall = load.run(clients)
    for t in dribbler_threads:
        t.join(15)
    for t in hostile_threads:
        t.join(args.timeout + args.server_timeout + 5)
    memory = server.memory_mb()
    alive = server.proc.poll() is None
    return report(
        args, artifact, clients, hostile_n, load, hostile, dribblers, wall, unloaded_p95, warm_rss, memory, alive
    )


def report(
    args, artifact, clients, hostile_n, load, hostile, dribblers, wall, unloaded_p95, warm_rss, memory, alive
) -> dict:
    """Print one mix's figures; return its summary (with ``ok``)."""
    lat = np.asarray(load.latencies) * 1e3
    done = sum(load.outcomes.values())
    answered = load.outcomes["correct"] + load.outcomes["wrong answer"]
    pct = {p: float(np.percentile(lat, p)) if lat.size else float("nan") for p in (50, 95, 99)}
    summary = {
        "artifact": str(artifact),
        "ram": args.ram,
        "threads": args.threads,
        "clients": clients,
        "batch": args.batch,
        "requests": done,
        "answered": answered,
        "texts": answered * args.batch,
        "wall_s": round(wall, 3),
        "requests_per_s": round(answered / wall, 2),
        "texts_per_s": round(answered * args.batch / wall, 2),
        "latency_ms": {f"p{p}": round(v, 2) for p, v in pct.items()}
        | {"max": round(float(lat.max()), 2) if lat.size else None},
        "errors": {k: v for k, v in load.outcomes.items() if k != "correct"},
        "correct_rate": round(load.outcomes["correct"] / done, 4) if done else None,
        "max_top1_score_diff": load.max_score_diff,
        "server_rss_before_mb": warm_rss["VmRSS"],
        "server_rss_after_mb": memory["VmRSS"],
        "server_peak_rss_mb": memory["VmHWM"],
        "server_alive_after_load": alive,
        "hostile_clients": hostile_n,
        "hostile": dict(hostile.outcomes),
        "hostile_wrong_status": hostile.bad(),
        "max_memory_mb": args.max_memory,
        "unloaded_p95_ms": round(unloaded_p95, 2),
        "p95_over_unloaded": round(pct[95] / unloaded_p95, 2),
        "dribblers": {
            "peak_connected": dribblers.peak,
            "cut_off": dribblers.cut,
            "health": dict(dribblers.health),
            "health_max_ms": round(max(dribblers.health_ms), 1) if dribblers.health_ms else None,
        },
    }
    print(
        f"requests        {done} sent, {answered} answered with 200 "
        f"({args.batch} text(s) each = {answered * args.batch} texts)"
    )
    print(f"wall time       {wall:.2f} s")
    print(f"throughput      {summary['requests_per_s']:.2f} requests/s, {summary['texts_per_s']:.2f} texts/s")
    print(
        f"latency (ms)    p50 {pct[50]:.1f}  p95 {pct[95]:.1f}  p99 {pct[99]:.1f}  max {summary['latency_ms']['max']}"
    )
    print(
        f"unloaded p95    {unloaded_p95:.1f} ms (one client alone); "
        f"loaded p95 / unloaded = {pct[95] / unloaded_p95:.2f}"
    )
    print(f"errors          {summary['errors'] or 'none'}")
    print(f"correct (top-1) {summary['correct_rate']}  (largest top-1 score difference {load.max_score_diff:.2e})")
    print(
        f"server RSS (MB) before the load {warm_rss['VmRSS']}, after {memory['VmRSS']}, "
        f"peak (VmHWM) {memory['VmHWM']}; {'alive' if alive else 'DEAD'} after the load"
    )
    if hostile_n:
        print(f"hostile         {dict(sorted(hostile.outcomes.items()))}")
        print(f"hostile wrong   {hostile.bad() or 'none'} (5xx, resets, or a status other than HTTP's for the kind)")
    health_bad = args.dribblers and set(dribblers.health) != {"200"}
    if args.dribblers:
        print(
            f"dribblers       {args.dribblers} (peak {dribblers.peak} connected at once, {dribblers.cut} cut off "
            f"by the deadline); GET /health from another client: {dict(dribblers.health)}, slowest "
            f"{summary['dribblers']['health_max_ms']} ms"
        )
    over = args.max_memory is not None and not (memory["VmHWM"] or float("inf")) <= args.max_memory
    if args.max_memory is not None:
        print(
            f"memory bound    peak {memory['VmHWM']} MB {'EXCEEDS' if over else 'within'} "
            f"--max-memory {args.max_memory:g} MB"
        )
    for note in load.examples:
        print(f"  e.g. {note}")
    print("SUMMARY " + json.dumps(summary), flush=True)
    summary["ok"] = bool(
        done and load.outcomes["correct"] == done and not hostile.bad() and not over and not health_bad and alive
    )
    return summary


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted (the server was stopped)", file=sys.stderr)
        sys.exit(130)
    except (ValueError, FileNotFoundError) as e:  # bad artifact or data: a message, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

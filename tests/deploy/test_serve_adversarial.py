"""``sharebert serve`` against hostile input on 127.0.0.1: every case gets a valid status line and a
JSON 4xx (never a reset, a hang or a 5xx other than the 503 of overload); limits; startup errors."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import Runtime
from sharebert_runtime.runtime import shortest_floats, top_k_softmax
from sharebert_runtime.serve import make_server

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
LIMITS = dict(
    max_batch=8,
    max_body_bytes=12000,
    max_tokens=200,
    max_top_k=5,
    timeout=2,
    header_timeout=2,
    workers=1,
    max_queue=1,
    max_connections=16,
    max_candidates=40,
)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    build_model("sharebert-tiny", root / "model", TINY, seed=2)
    export_model(root / "model", root / "artifact", task="fill-mask", check_limit=16, runs=3, progress=False)
    return root / "artifact"


@pytest.fixture
def serve(artifact):
    """Start servers with the given limits on free loopback ports; all stopped after the test."""
    servers = []

    def start(**limits):
        runtime = Runtime(artifact, threads=1)
        server = make_server(runtime, "127.0.0.1", 0, quiet=True, **limits)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, runtime

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def exchange(port: int, data: bytes, timeout: float = 10) -> tuple[int, dict, str]:
    """Send raw bytes, read until the server closes or one full response arrived: (status, JSON body, head)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = _response(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n")[0].decode("latin-1")
    assert status_line.startswith("HTTP/1.1 ") and status_line[9:12].isdigit(), reply[:200]
    assert b"Content-Type: application/json" in head, head
    return int(status_line[9:12]), json.loads(body, parse_constant=_not_json), head.decode("latin-1")


def _until(condition, what: str) -> None:
    """Wait for the server's own state to show ``condition()`` (a fixed sleep is too short on a loaded machine)."""
    for _ in range(6000):  # a bound against a hang only: 10 ms at a time, at most a minute
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"the server never reached: {what}")


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def post(body: bytes, headers: bytes = b"", path: bytes = b"/fill-mask") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (path, len(body), headers, body)


HOSTILE = [  # (case, raw request, status, part of the error message)
    ("deeply nested list", post(b"[" * 5000 + b"]" * 5000), 400, "nested too deeply"),
    ("deeply nested value", post(b'{"text": ' + b"[" * 2000 + b"]" * 2000 + b"}"), 400, "nested too deeply"),
    ("5000-digit number", post(b'{"text": "a [MASK]", "top_k": ' + b"9" * 5000 + b"}"), 400, "4300 digits"),
    ("1e999 (inf) top_k", post(b'{"text": "a [MASK]", "top_k": 1e999}'), 400, "top_k"),
    ("NaN top_k", post(b'{"text": "a [MASK]", "top_k": NaN}'), 400, "top_k"),
    ("top_k over the cap", post(b'{"text": "a [MASK]", "top_k": 6}'), 400, "[1, 5]"),
    ("lone surrogate in text", post(b'{"text": "a \\ud800 [MASK]"}'), 400, "lone surrogate"),
    ("lone surrogate as a key", post(b'{"text": "a", "\\udc00": 1}'), 400, "unknown field"),
    ("not UTF-8", post(b'{"text": "\xff"}'), 400, "UTF-8"),
    ("texts over the cap", post(json.dumps({"texts": ["a"] * 9}).encode()), 413, "limit of 8"),
    ("tokens over the cap", post(json.dumps({"texts": ["word " * 60] * 4}).encode()), 413, "limit of 200"),
    (
        "candidates over the cap",
        post(json.dumps({"text": "[MASK] " * 9, "top_k": 5}).encode()),
        413,
        "9 [MASK] tokens x top_k 5 = 45 candidates exceed the limit of 40 per request (--max-candidates)",
    ),
    (
        "candidates over the cap, default top_k",
        post(json.dumps({"texts": ["[MASK] a [MASK]"] * 4 + ["[MASK]"]}).encode()),
        413,
        "9 [MASK] tokens x top_k 5 = 45 candidates",
    ),
    ("body over the cap", post(json.dumps({"text": "y" * 13000}).encode()), 413, "limit of 12000"),
    (
        "declared 1 GB, nothing sent",
        b"POST /fill-mask HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n",
        413,
        "limit of 12000",
    ),
    (
        "Expect 100-continue, oversize",
        b"POST /fill-mask HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 99999\r\n\r\n",
        413,
        "limit of 12000",
    ),
    (
        "Content-Length not a number",
        b"POST /fill-mask HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}",
        400,
        "Content-Length",
    ),
    ("Content-Length negative", b"POST /fill-mask HTTP/1.1\r\nContent-Length: -1\r\n\r\n{}", 400, "Content-Length"),
    (
        "Content-Length superscript digit",
        b"POST /fill-mask HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n{}",
        400,
        "Content-Length",
    ),
    (
        "Content-Length 30 digits",
        b"POST /fill-mask HTTP/1.1\r\nContent-Length: " + b"9" * 30 + b"\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        "Content-Length twice",
        b"POST /fill-mask HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        400,
        "Content-Length",
    ),
    (
        "chunked and Content-Length",
        b"POST /fill-mask HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",
        400,
        "Transfer-Encoding",
    ),
    (
        "chunked only",
        b"POST /fill-mask HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        411,
        "Content-Length",
    ),
    ("no Content-Length", b"POST /fill-mask HTTP/1.1\r\n\r\n", 411, "Content-Length"),
    ("body shorter than declared", b"POST /fill-mask HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}", 408, "2 of 100 bytes"),
    ("binary bytes", b"\x00\xff\xfe\x16\x03\r\n\r\n", 400, "bad request line"),
    ("blank line", b"\r\n", 400, "bad request line"),
    ("HTTP/0.9", b"GET /health\r\n", 400, "bad request line"),
    ("HTTP/2.0", b"GET /health HTTP/2.0\r\n\r\n", 400, "HTTP/1.1"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "HTTP/1.1"),
    ("HTTP/1.1.1", b"GET /health HTTP/1.1.1\r\n\r\n", 400, "version"),
    ("FTP/1.0", b"GET /health FTP/1.0\r\n\r\n", 400, "version"),
    ("request line of 70 kB", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "URI Too Long"),
    ("unknown method", b"BREW /health HTTP/1.1\r\n\r\n", 405, "BREW"),
    ("wrong path GET", b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", 404, "no endpoint"),
    ("wrong path POST", post(b'{"text": "a"}', path=b"/admin"), 404, "no endpoint"),
    ("another task's path", post(b'{"text": "a"}', path=b"/classify"), 400, "no endpoint"),
]


@pytest.mark.parametrize("case, request_bytes, status, message", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_hostile_input_gets_json_4xx(serve, case, request_bytes, status, message):
    server, _ = serve(**LIMITS)
    got, body, head = exchange(
        server.server_address[1], request_bytes
    )  # answered, not left to hang (exchange's timeout)
    assert (got, message in body["error"]) == (status, True), (case, got, body)
    got, body, _ = exchange(server.server_address[1], b"GET /health HTTP/1.1\r\n\r\n")  # and the server lives on
    assert (got, body) == (200, {"status": "ok"})


def test_fill_mask_top_k_is_the_full_logits_top_k(serve, artifact):
    """The [MASK]-only top_k in token-budgeted calls equals softmax + sort over the full logits of one call."""
    rt = Runtime(artifact, threads=1)
    texts = ["a [MASK] film .", "[MASK] [MASK] is " + "very " * 40 + "[MASK] .", "no mask here", ""]
    ids, mask, _ = rt._encode(texts)
    logits = rt._run(ids, mask)["logits"].astype(np.float64)
    rt.max_batch_tokens = 16  # several calls, each a few texts
    got = rt.fill_mask(texts, top_k=4)
    for row, answers in enumerate(got):
        positions = np.flatnonzero(ids[row] == rt.mask_id)
        assert len(answers) == len(positions)
        for pos, candidates in zip(positions, answers):
            probs = np.exp(logits[row, pos] - logits[row, pos].max())
            probs /= probs.sum()
            best = np.argsort(-probs, kind="stable")[:4]
            assert [c["token_id"] for c in candidates] == best.tolist()
            assert np.abs(np.array([c["score"] for c in candidates]) - probs[best]).max() <= 1e-5


def test_top_k_softmax_follows_the_math():
    logits = np.log(np.array([[1.0, 3.0, 2.0, 2.0], [4.0, 1.0, 1.0, 2.0]], dtype=np.float32))
    ids, probs = top_k_softmax(logits, 3)
    assert ids.tolist() == [[1, 2, 3], [0, 3, 1]]  # ties in id order
    np.testing.assert_allclose(probs, [[3 / 8, 2 / 8, 2 / 8], [4 / 8, 2 / 8, 1 / 8]], rtol=1e-6)
    assert top_k_softmax(np.zeros((0, 5), np.float32), 2)[0].shape == (0, 2)


def test_full_queue_gets_503_with_retry_after(serve):
    server, _ = serve(**LIMITS)
    port, request = server.server_address[1], post(b'{"text": "a [MASK] film"}')
    with server.admission.slot():  # the one worker is busy ...
        waiting = ThreadPoolExecutor(1).submit(exchange, port, request)  # ... and this one fills the queue
        _until(lambda: server.admission.admitted == 2, "the queued request admitted")
        status, body, head = exchange(port, request)
        assert status == 503 and "Retry-After: 1" in head and "busy" in body["error"]
    assert waiting.result()[0] == 200  # the queued one is answered once the worker is free
    assert exchange(port, request)[0] == 200


def test_connections_over_the_cap_get_503(serve):
    server, _ = serve(**{**LIMITS, "max_connections": 3})
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        _until(lambda: server.per_client.get("127.0.0.1") == 3, "3 connections counted")
        status, body, head = exchange(port, b"GET /metadata HTTP/1.1\r\n\r\n")
        assert status == 503 and "Retry-After" in head and "connections" in body["error"]
        assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[:2] == (200, {"status": "ok"})  # healthy, though full
    finally:
        for s in idle:
            s.close()
    _until(lambda: exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[0] == 200, "answering once they closed")


def _closed_within(s: socket.socket, limit: float) -> bool:
    """Whether the server closes ``s`` (reads until EOF; ``limit`` s only bounds a server that never does)."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        try:
            if not s.recv(65536):
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def _dribble(port: int, seconds: float, pieces) -> bool:
    """A client sending ``pieces`` (then header lines) one every 0.3 s: whether the server hangs up on it
    (``seconds`` only bounds a server that never does)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        pieces = iter(pieces)
        try:
            while time.monotonic() - t0 < seconds:
                s.sendall(next(pieces, b"X-Drip: 1\r\n"))
                time.sleep(0.3)
        except OSError:  # the server closed the connection
            return True
        return False


@pytest.mark.parametrize(
    "pieces",
    [[b"GET /health HTTP/1.1\r\n"], [bytes([b]) for b in b"GET /health HTTP/1.1\r\n"] * 4],
    ids=["a-header-line-at-a-time", "a-byte-at-a-time"],
)
def test_a_dribbling_client_is_cut_off_at_the_whole_request_deadline(serve, pieces):
    server, _ = serve(**LIMITS)  # timeout 2 s per request, whatever the pace of its lines or bytes
    assert _dribble(server.server_address[1], 60.0, pieces)  # hung up on; a per-line timeout never would


def test_connections_per_client_address_are_capped(serve):
    """127.0.0.2 holds its 3 connections; its 4th gets 503 while 127.0.0.1 is still answered."""
    server, _ = serve(**{**LIMITS, "max_client_connections": 3, "timeout": 10})
    port = server.server_address[1]
    held = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", port))
            held.append(s)
        _until(lambda: server.per_client.get("127.0.0.2") == 3, "127.0.0.2's 3 connections counted")
        extra = socket.socket()
        extra.bind(("127.0.0.2", 0))
        extra.connect(("127.0.0.1", port))
        extra.sendall(b"GET /metadata HTTP/1.1\r\n\r\n")
        extra.settimeout(5)
        reply = b"".join(iter(lambda: extra.recv(65536), b""))
        extra.close()
        assert reply.startswith(b"HTTP/1.1 503") and b"connections from 127.0.0.2" in reply, reply
        assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[0] == 200
    finally:
        for s in held:
            s.close()


def _response(s: socket.socket) -> bytes:
    """One whole response on a kept-alive connection (its head and Content-Length bytes of body, sent in any pieces)."""
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def test_idle_keep_alive_connections_are_capped(serve):
    server, _ = serve(**{**LIMITS, "max_idle": 1, "timeout": 120})  # closed by the cap, long before the timeout
    port = server.server_address[1]
    with (
        socket.create_connection(("127.0.0.1", port)) as first,
        socket.create_connection(("127.0.0.1", port)) as second,
    ):
        first.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        assert b"Connection: close" not in _response(first)  # kept alive: the one idle place
        second.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        time.sleep(0.2)
        assert b"Connection: close" in _response(second) and _closed_within(second, 60)
        first.sendall(b"GET /metadata HTTP/1.1\r\n\r\n")  # the idle one still serves its next request
        assert _response(first).startswith(b"HTTP/1.1 200")


def test_a_get_body_is_never_parsed_as_the_next_request(serve):
    server, _ = serve(**LIMITS)
    smuggled = b"GET /metadata HTTP/1.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled)
        s.settimeout(5)
        reply = b"".join(iter(lambda: s.recv(65536), b""))  # the server closes after its one answer
    assert reply.count(b"HTTP/1.1 ") == 1 and reply.startswith(b"HTTP/1.1 200") and b"Connection: close" in reply


def test_a_non_finite_output_is_a_json_error_never_nan(serve, artifact, tmp_path):
    import shutil

    import onnx
    from onnx import numpy_helper

    folder = tmp_path / "nan"
    shutil.copytree(artifact, folder)
    proto = onnx.load(str(folder / "model.onnx"))
    init = next(i for i in proto.graph.initializer if "LayerNorm.weight" in i.name)
    init.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(init).shape, np.nan, np.float32), init.name))
    onnx.save(proto, str(folder / "model.onnx"))
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / "model.onnx").read_bytes()
    import hashlib

    manifest["files"]["model.onnx"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    server = make_server(Runtime(folder, threads=1), "127.0.0.1", 0, quiet=True, **LIMITS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body, _ = exchange(server.server_address[1], post(b'{"text": "a [MASK] film"}'))  # strict parse below
    finally:
        server.shutdown()
        server.server_close()
    assert status == 500 and "not finite" in body["error"]


def test_a_light_request_is_answered_while_the_heavy_lane_is_taken(serve):
    """With a large request in flight (the one large place of 2 workers taken), a small request is answered at
    once, as the runtime answers it, and another large one gets 503 + Retry-After; once free, it is answered."""
    server, runtime = serve(**{**LIMITS, "workers": 2, "max_batch_tokens": 64, "max_candidates": 100})
    port, light = server.server_address[1], post(b'{"text": "a [MASK] film", "top_k": 2}')
    heavy_texts = ["a [MASK] film that " + "is very " * 25 + "[MASK] ."] * 2  # 2 x 56 tokens: over 64
    heavy = post(json.dumps({"texts": heavy_texts, "top_k": 3}).encode())
    with server.admission.slot(heavy=True):  # a large request is running
        status, body, _ = exchange(port, light)
        assert (status, body["results"]) == (
            200,
            json.loads(json.dumps(list(runtime.fill_mask(["a [MASK] film"], top_k=2)))),
        )
        status, body, head = exchange(port, heavy)
        assert status == 503 and "large request" in body["error"] and "Retry-After: 1" in head
    status, body, _ = exchange(port, heavy, timeout=120)
    assert (status, body["results"]) == (200, json.loads(json.dumps(list(runtime.fill_mask(heavy_texts, top_k=3)))))


def test_scores_are_written_in_float32s_shortest_form():
    values = np.random.default_rng(0).random(200, dtype=np.float32) ** 8
    short = shortest_floats(values)
    assert np.array_equal(np.array(short, dtype=np.float32), values)  # the same float32 numbers
    assert sum(map(len, map(repr, short))) < 0.7 * sum(len(repr(float(v))) for v in values)
    assert shortest_floats(np.float32(1) / 3) == 0.33333334


def test_heavy_requests_leave_a_worker_to_light_ones():
    from sharebert_runtime.serve import Admission, BadRequest

    admission = Admission(workers=2, queue=4)
    with admission.slot(heavy=True):
        with pytest.raises(BadRequest) as e, admission.slot(heavy=True):
            pass
        assert e.value.status == 503 and "large request" in str(e.value)
        with admission.slot():  # a light request still gets the other worker at once
            pass
    with admission.slot(), admission.slot():  # both workers busy with small requests: a large one is shed first
        with pytest.raises(BadRequest) as e, admission.slot(heavy=True):
            pass
        assert e.value.status == 503 and "while a worker is free" in str(e.value)
    with admission.slot(), admission.slot(heavy=True):  # one worker free: taken
        pass


def test_many_simultaneous_clients_all_answered(artifact):
    """80 clients connect while the server is not yet accepting: the backlog holds them all (the stdlib's
    5 held 6 and left the others' handshakes unanswered), then every one gets its right answer."""
    runtime = Runtime(artifact, threads=1)
    server = make_server(
        runtime,
        "127.0.0.1",
        0,
        quiet=True,
        max_queue=100,  # listening, not yet accepting
        max_client_connections=100,
    )  # all 80 from one address: the backlog is tested here
    port, n = server.server_address[1], 80
    want = json.loads(json.dumps(list(runtime.fill_mask(["a [MASK] film"], top_k=2))))
    clients, serving = [socket.socket() for _ in range(n)], None
    try:
        for s in clients:
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
        _, connected, _ = select.select([], clients, [], 2.0)  # handshakes the kernel completed for the backlog
        assert len(connected) == n
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        request = post(b'{"text": "a [MASK] film", "top_k": 2}', b"Connection: close\r\n")
        for s in clients:
            s.setblocking(True)
            s.sendall(request)
        replies = [_read_reply(s) for s in clients]
    finally:
        for s in clients:
            s.close()
        if serving is not None:
            server.shutdown()
        server.server_close()
    assert [status for status, _ in replies] == [200] * n
    assert all(body["results"] == want for _, body in replies)


def _read_reply(s: socket.socket) -> tuple[int, dict]:
    s.settimeout(15)
    reply = b"".join(iter(lambda: s.recv(65536), b""))  # Connection: close: the server ends the reply
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head[9:12]), json.loads(body)


STARTUP = [  # (case, arguments after the artifact, message)
    ("port out of range", ["--port", "70000"], "--port must be in [0, 65535]"),
    ("unknown host", ["--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid"),
    ("address not here", ["--host", "192.0.2.1"], "cannot listen on 192.0.2.1"),
    ("zero workers", ["--workers", "0"], "--workers must be a positive integer"),
    ("missing artifact", None, "artifact folder not found"),
    ("port in use", ["--port", "IN_USE"], "Address already in use"),
]


@pytest.mark.parametrize("case, extra, message", STARTUP, ids=[row[0] for row in STARTUP])
def test_startup_errors_are_one_line_exit_2(artifact, tmp_path, case, extra, message):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = (
            [str(tmp_path / "none")]
            if extra is None
            else [str(artifact)] + [str(taken.getsockname()[1]) if a == "IN_USE" else a for a in extra]
        )
        done = subprocess.run(  # started as the console script starts it: serve imports no torch
            [sys.executable, "-m", "sharebert_runtime", "serve", *args], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr, done.stderr


# -- slow clients: a header deadline, idle connections first to go, /health always ---------------------------------

STALLED_HEAD = b"POST /fill-mask HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"


def _connect_from(address: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((address, 0))  # 127.0.0.2, .3, ...: all loopback on Linux, each a client address of its own
    s.connect(("127.0.0.1", port))
    return s


def _until_closed(s: socket.socket, bound: float = 60) -> bytes | None:
    """What the server sent before it closed ``s`` (EOF or reset), or None if it never did (``bound`` s: a hang
    guard only)."""
    reply, t0 = b"", time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < bound:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset
            return reply
        if not chunk:
            return reply
        reply += chunk
    return None


@pytest.mark.parametrize(
    "sent, answer",
    [
        (b"", b""),  # connected, sent nothing: closed without a word
        (b"GET /health HTTP/1.1\r\nHost: t\r\n", b"HTTP/1.1 408"),  # headers never ended
        (STALLED_HEAD + b"{", b"HTTP/1.1 408"),  # whole headers and one body byte, then nothing
    ],
    ids=["nothing", "headers-unfinished", "headers-and-one-body-byte"],
)
def test_a_stalled_connection_is_closed_at_the_header_deadline_not_the_timeout(serve, sent, answer):
    server, _ = serve(**{**LIMITS, "header_timeout": 1, "timeout": 600})
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as s:
        s.sendall(sent)
        reply = _until_closed(s)
    assert reply is not None and reply.startswith(answer), reply
    assert b"--header-timeout" in reply or not answer


def test_a_dribbling_client_is_closed_at_the_header_deadline(serve):
    server, _ = serve(**{**LIMITS, "header_timeout": 1, "timeout": 600})
    assert _dribble(server.server_address[1], 60.0, [b"GET /health HTTP/1.1\r\n"])  # a header line every 0.3 s


def _stall(addresses: list[str], per_address: int, port: int) -> list[socket.socket]:
    """``per_address`` stalled connections from each address, half with unfinished headers, half with whole
    headers and one body byte."""
    held = []
    for address in addresses:
        for i in range(per_address):
            s = _connect_from(address, port)
            s.sendall(b"GET /health HTTP/1.1\r\nX-Slow: 1\r\n" if i % 2 else STALLED_HEAD + b"{")
            held.append(s)
    return held


@pytest.mark.parametrize("addresses, per_address", [(4, 32), (4, 50), (100, 2)], ids=["4x32", "4x50", "100x2"])
def test_health_and_requests_are_answered_while_connections_stall(serve, addresses, per_address):
    """128-200 stalled connections (the issue's load) from several loopback addresses: /health stays 200 and a
    well-behaved client's request is answered as the runtime answers it, with the default connection caps."""
    limits = {k: v for k, v in LIMITS.items() if k not in ("max_connections", "max_queue")}
    server, runtime = serve(**{**limits, "header_timeout": 600})  # they stay stalled for the whole test
    port = server.server_address[1]
    want = json.loads(json.dumps(list(runtime.fill_mask(["a [MASK] film"], top_k=2))))
    held = _stall([f"127.0.0.{2 + i}" for i in range(addresses)], per_address, port)
    try:
        counted = min(per_address, server.max_client_connections) * addresses
        _until(lambda: server.open == counted, f"{counted} stalled connections open")
        for _ in range(3):
            assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[:2] == (200, {"status": "ok"})
            status, body, _ = exchange(port, post(b'{"text": "a [MASK] film", "top_k": 2}'))
            assert (status, body["results"]) == (200, want)
        _until(lambda: server.open == counted, "the stalled ones still open")  # answered beside them
    finally:
        for s in held:
            s.close()


def test_idle_keep_alive_connections_are_the_first_to_go_when_full(serve):
    """4 connections at most: 2 idle after a request and 2 stalled. A new client is answered (the oldest idle
    connection is closed for it); with no idle one left, a request gets 503, and /health still 200."""
    server, _ = serve(**{**LIMITS, "max_connections": 4, "max_idle": 4, "timeout": 600, "header_timeout": 600})
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    stalled = _stall(["127.0.0.2"], 2, port)
    try:
        for s in idle:
            s.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            assert b"Connection: close" not in _response(s)  # kept alive
        _until(lambda: server.open == 4 and len(server._idle_conns) == 2, "2 idle (back with the reading thread)")
        with socket.create_connection(("127.0.0.1", port)) as new:  # a 5th: the oldest idle one makes room
            new.sendall(b"GET /metadata HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert _response(new).startswith(b"HTTP/1.1 200")
        _until(lambda: server.idle == 1, "one idle connection closed")
        (closed,) = select.select(idle, [], [], 30)[0]  # its end of stream (the other has nothing to read)
        assert _until_closed(closed) == b""  # closed without a word
        (kept,) = set(idle) - {closed}
        kept.sendall(b"GET /metadata HTTP/1.1\r\n\r\n")  # the other one still serves
        assert _response(kept).startswith(b"HTTP/1.1 200")
        kept.close()
        _until(lambda: server.open == 2 and server.idle == 0, "only the stalled ones left")
        stalled += [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        _until(lambda: server.open == 4, "full of stalled connections, none idle")
        status, body, head = exchange(port, b"GET /metadata HTTP/1.1\r\n\r\n")
        assert status == 503 and "too many open connections" in body["error"] and "Retry-After: 1" in head
        assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[:2] == (200, {"status": "ok"})
    finally:
        for s in idle + stalled:
            s.close()


def test_bytes_buffered_for_all_connections_together_are_capped(serve):
    """--max-buffered-bytes: each stalled connection declaring a 12,000-byte body holds its head and that body
    (counted whole once the head declares it); with room for 6 and a small request, a 7th large one is shed with
    503 + Retry-After, /health and a small request are still answered, and once the stalled ones go the count is
    back to 0 and the large request is answered."""
    from sharebert_runtime.serve import HEAD_BYTES

    head = b"POST /fill-mask HTTP/1.1\r\nHost: t\r\nContent-Length: 12000\r\n\r\n"
    cap = LIMITS["max_body_bytes"] + HEAD_BYTES  # the least allowed: one whole request of the largest size
    stalled_each = len(head) + 12000
    server, _ = serve(**{**LIMITS, "max_buffered_bytes": cap, "header_timeout": 600})
    port = server.server_address[1]
    fits = cap // stalled_each  # 6 stalled connections' requests fit, a 7th does not
    stalled = _stall(["127.0.0.2"], 0, port)
    try:
        for _ in range(fits):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head + b"{")
            stalled.append(s)
        _until(lambda: server.buffered == fits * stalled_each, f"{fits} stalled requests counted whole")
        large = post(json.dumps({"text": "a [MASK] film " + "x" * (12000 - 40)}).encode())
        status, body, reply_head = exchange(port, large)
        assert status == 503 and "--max-buffered-bytes" in body["error"] and "Retry-After: 1" in reply_head
        assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[:2] == (200, {"status": "ok"})
        assert exchange(port, post(b'{"text": "a [MASK] film"}'))[0] == 200  # a small one fits beside them
    finally:
        for s in stalled:
            s.close()
    _until(lambda: server.buffered == 0 and server.open == 0, "every byte uncounted once they closed")
    assert exchange(port, large)[0] == 200


@pytest.mark.parametrize("body_bytes, buffered", [(12000, 12000), (1000, 66535)])
def test_a_buffered_cap_that_holds_no_whole_request_is_refused(body_bytes, buffered):
    from sharebert_runtime.serve import _checked_limits

    with pytest.raises(ValueError, match=r"--max-buffered-bytes \d+ holds no request of --max-body-bytes"):
        _checked_limits({"max_body_bytes": body_bytes, "max_buffered_bytes": buffered})


def test_stalled_large_bodies_leave_room_for_small_requests(serve):
    """Connections that declare large bodies and stall (a hostile client's way to fill --max-buffered-bytes) take at
    most the buffer less a reserve of --max-connections x 64 KiB, so every connection's small request (64 KiB at
    most in all) still fits: here 5 stalled 200,000-byte requests are held (1 MiB of a 2 MiB buffer), the next is
    shed, and after small stalled requests on every connection left but one, a well-behaved request is answered.
    Before, the stalled ones took the whole buffer and every client's request got 503."""
    from sharebert_runtime.serve import HEAD_BYTES

    cap, body = 2 << 20, 200_000
    server, _ = serve(**{**LIMITS, "max_body_bytes": body, "max_buffered_bytes": cap, "header_timeout": 600})
    port = server.server_address[1]
    reserve = LIMITS["max_connections"] * HEAD_BYTES
    held, shed = [], 0

    def stall(size: int) -> bool:
        """A connection declaring a ``size``-byte body and sending one byte of it: held (True) or shed (False)."""
        before = server.buffered
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /fill-mask HTTP/1.1\r\nContent-Length: %d\r\n\r\n{" % size)
        _until(lambda: server.buffered > before or select.select([s], [], [], 0)[0], "the request held or shed")
        if server.buffered > before:
            held.append(s)
            return True
        s.close()
        return False

    try:
        while len(held) + shed < LIMITS["max_connections"] - 1 and shed == 0:
            shed += not stall(body)
        head = len(b"POST /fill-mask HTTP/1.1\r\nContent-Length: 200000\r\n\r\n")
        assert (len(held), shed) == ((cap - reserve) // (head + body), 1)
        while len(held) < LIMITS["max_connections"] - 1 and cap - server.buffered > 200:  # small ones fill what is left
            assert stall(min(cap - server.buffered - 200, HEAD_BYTES - 100))
        assert exchange(port, post(b'{"text": "a [MASK] film"}'))[0] == 200
        assert exchange(port, b"GET /health HTTP/1.1\r\n\r\n")[:2] == (200, {"status": "ok"})
    finally:
        for s in held:
            s.close()


def _open_files(limit: int):
    """For a child process: at most ``limit`` open file descriptors (soft and hard: none to raise it to)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def test_max_connections_beyond_the_open_files_limit_is_refused_at_startup(artifact):
    """256 connections, and the 256 read before their 503, need 576 file descriptors: under `ulimit -n 400` serve
    refuses at startup in one line naming both, where it used to start and fail every accept once they were open."""
    done = subprocess.run(
        [sys.executable, "-m", "sharebert_runtime", "serve", str(artifact), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_open_files(400),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--max-connections 256 needs 576 open files" in lines[0] and "may open 400 (ulimit -n)" in lines[0]


@pytest.mark.slow
def test_out_of_file_descriptors_the_listening_socket_rests(artifact):
    """A server out of file descriptors (started from Python, without serve's startup check) leaves its listening
    socket alone for ACCEPT_PAUSE_S after a failed accept: one failure line per pause, where every loop failed again
    at once (150,000 lines in 8 s); once the stalled connections are closed at the header deadline, a waiting
    /health is answered 200."""
    from sharebert_runtime.serve import ACCEPT_PAUSE_S

    script = (
        "import sys, threading, time\n"
        "from sharebert_runtime import Runtime\n"
        "from sharebert_runtime.serve import make_server\n"
        f"server = make_server(Runtime({str(artifact)!r}, threads=1), port=0, quiet=False, header_timeout=3)\n"
        "print(server.server_address[1], flush=True)\n"
        "server.serve_forever()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_open_files(64)
    )
    try:
        port = int(child.stdout.readline())
        started = time.monotonic()
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]  # more than it can open
        for s in stalled:
            s.sendall(b"GET /health HTTP/1.1\r\n")
        status, body, _ = exchange(port, b"GET /health HTTP/1.1\r\n\r\n", timeout=60)
        elapsed = time.monotonic() - started
    finally:
        child.kill()
        _, err = child.communicate(timeout=60)
        for s in stalled:
            s.close()
    failures = err.decode().count("accept failed")
    assert (status, body) == (200, {"status": "ok"})
    assert 1 <= failures <= elapsed / ACCEPT_PAUSE_S + 2, (failures, elapsed)

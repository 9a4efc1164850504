"""``sharebert serve``: a small local JSON service for an exported artifact (stdlib HTTP, no torch).

Endpoints:

* ``GET /health`` -> ``{"status": "ok"}``; ``GET /metadata`` -> task, labels, limits, RAM mode.
* ``POST /predict`` (and the task's own path: ``/fill-mask``, ``/classify``, ``/embed`` or
  ``/generate``) with ``{"texts": [...]}`` or ``{"text": "..."}`` and optional ``top_k``,
  ``pooling`` and ``normalize`` (embed: override the artifact's recipe), ``text_pair`` (classify: the second
  text of each pair, a string with ``text`` or a list with ``texts``; a model the manifest says was trained on pairs
  takes ``text<TAB>text_pair`` texts without it, a single-text model refuses it) or ``max_new_tokens``, and ``depth``
  (encoder layers to run, 1..N, for artifacts that have a depth input; default ``--depth`` or all)
  -> ``{"results": [...], "truncated": n}``.

Bad input of any shape gets a 4xx with ``{"error": message}`` and a valid status line: 400 bad JSON,
fields, headers or request line (an unsupported HTTP version included), 404/405 wrong path or method, 408 a request not
sent within ``--header-timeout``, 411 no length, 413 body, texts, tokens or fill-mask candidates (``[MASK]`` tokens x
``top_k``) over the limits (an oversize body is refused before it is read). Overload gets 503 with ``Retry-After``: more
than ``--workers`` + ``--max-queue`` requests admitted, more than ``--workers`` - 1 large ones (over
``--max-batch-tokens`` tokens: small requests always keep a worker) or a large one while no worker is free,
``--max-connections`` open or ``--max-client-connections`` from one address, or more than ``--max-buffered-bytes`` of
requests held for all connections together (a body counted whole once its head declares it; a refused connection's
request is read first, so the client reads the 503 rather than a reset; a ``GET /health`` is answered 200 even
then). One thread reads
every connection's request (a slow client holds no thread); ``--header-timeout`` bounds a whole request (headers and
body, however slowly dribbled), counted from the connection (or, kept alive, from its next request's first byte);
at most ``--max-idle`` connections are kept alive between requests, each for ``--timeout`` seconds, and the oldest
idle one is closed first when the server is full. Every
answer is strict JSON (a non-finite result is a 500 with an error, never ``NaN``); a GET with a body
closes its connection (the body is never read as the next request).

Scores and vectors are written in float32's shortest decimal form.

Memory is bounded by the limits: at most ``--workers`` requests run at once, each one ONNX Runtime
call of at most ``--max-batch-tokens`` padded tokens at a time (see docs/DEVICE.md for the bound).
"""

from __future__ import annotations

import http.client
import inspect
import io
import json
import re
import selectors
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .memory import give_back, limit_arenas

TASK_PATHS = {
    "fill-mask": "/fill-mask",
    "text-classification": "/classify",
    "feature-extraction": "/embed",
    "causal-lm": "/generate",
}
MAX_NEW_TOKENS = 256
RETRY_AFTER_S = 1  # what a 503 asks the client to wait
DRAIN_BYTES = 1 << 16  # after refusing a body, read at most this much of it so the client sees the answer
REFUSING = 256  # connections over a cap held at once to read their request before the 503 (beyond: 503 at once)
REFUSE_READ_S = 2  # seconds a refused connection has to send its request (and then to close after the answer)
MAX_LINE = 65536  # the stdlib handler's longest request line (414 beyond)
HEAD_BYTES = 1 << 16  # most bytes of a request's head read before it is refused (431)
READ_BYTES = 1 << 16  # one receive of the reading thread
SPARE_FILES = 64  # file descriptors beside the connections: the listening socket, the wake-up pair, stdio, the model
ACCEPT_PAUSE_S = 0.1  # out of file descriptors: how long the listening socket rests before the next accept
DIGITS = re.compile(r"[0-9]{1,18}")
LIMITS = {  # option -> (default, what it bounds); all shown in GET /metadata
    "max_batch": (64, "texts per request"),
    "max_tokens": (8192, "tokens per request, after each text is cut to the artifact's max_length"),
    "max_top_k": (20, "fill-mask: largest top_k"),
    "max_candidates": (4096, "fill-mask: [MASK] tokens x top_k per request (the candidates answered)"),
    "max_body_bytes": (1 << 20, "request body bytes"),
    "max_buffered_bytes": (
        64 << 20,
        "request bytes held for all connections together, from their first byte until answered (a body counted "
        "whole once its head declares it); more get 503 + Retry-After",
    ),
    "max_batch_tokens": (1024, "padded tokens per ONNX Runtime call (bounds each call's memory)"),
    "workers": (2, "requests computed at once"),
    "max_queue": (16, "admitted requests waiting for a worker; more get 503 + Retry-After"),
    "max_connections": (256, "open connections (idle kept-alive ones closed first); more get 503 + Retry-After"),
    "max_client_connections": (32, "open connections from one client address; more get 503 + Retry-After"),
    "max_idle": (32, "idle keep-alive connections; beyond, an answer closes its connection"),
    "header_timeout": (5, "seconds a connection may take to send a whole request (headers and body); then closed"),
    "timeout": (30, "seconds a kept-alive connection may sit idle, or an answer wait for a client that does not read"),
}


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def add_arguments(p):
    p.add_argument("artifact", help="artifact folder written by `sharebert export`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads per request")
    from .runtime import RAM_MODES

    p.add_argument("--ram", choices=RAM_MODES, default="auto", help="see `sharebert predict --help`")
    for name, (default, what) in LIMITS.items():
        p.add_argument(
            "--" + name.replace("_", "-"), type=int, default=default, help=f"most {what} (default: {default})"
        )
    p.add_argument("--quiet", action="store_true", help="do not log each request")
    p.add_argument("--pin", metavar="SHA256", help="refuse the artifact unless manifest.json has this sha256")
    p.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="K",
        help='encoder layers to run by default (1..N; a request\'s "depth" field overrides it)',
    )


def params(task: str, max_top_k: int) -> list[tuple]:
    """The task's optional request fields: ``(name, type, lowest, highest)`` or ``(name, allowed values)``."""
    from .pooling import POOLING_MODES

    return {
        "fill-mask": [("top_k", int, 1, max_top_k)],
        "feature-extraction": [("pooling", POOLING_MODES), ("normalize", bool)],
        "causal-lm": [("max_new_tokens", int, 0, MAX_NEW_TOKENS)],
        "text-classification": [],
    }[task]


def _check_unicode(texts: list[str], what: str) -> None:
    """400 for a text that cannot be encoded (a lone surrogate escape from JSON)."""
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(400, f"{what} {i} is not valid Unicode (a lone surrogate escape)") from None


def parse_request(
    body: bytes,
    task: str,
    max_batch: int,
    max_top_k: int = LIMITS["max_top_k"][0],
    max_depth: int | None = None,
    pairs: bool | None = None,
) -> tuple[list[str], dict]:
    """Request body -> ``(texts, keyword arguments)``: the task's and ``depth`` (when ``max_depth``, the
    artifact's layers, allows one); raises :class:`BadRequest`. ``pairs``: the manifest's (a text-classification
    model trained on pairs, True; on single texts, False; None: not said): a pair model's texts without
    ``text_pair`` must each be ``text<TAB>text_pair``, and a single-text model refuses ``text_pair``."""
    payload = _json_object(body)
    texts = _texts(payload, max_batch)
    specs = params(task, max_top_k) + ([("depth", int, 1, max_depth)] if max_depth else [])
    if "depth" in payload and not max_depth:
        raise BadRequest(400, '"depth": this artifact has no depth input (one layer, or exported before depth support)')
    kwargs = {spec[0]: _checked_field(spec, payload[spec[0]]) for spec in specs if spec[0] in payload}
    if "text_pair" in payload:
        if pairs is False:
            raise BadRequest(400, '"text_pair": this model classifies single texts (it was not trained on pairs)')
        kwargs["text_pair"] = _text_pair(payload, task, texts)
    elif pairs and task == "text-classification":
        texts, kwargs["text_pair"] = _tab_pairs(texts)
    unknown = set(payload) - {"text", "texts", "text_pair"} - {s[0] for s in specs}
    if unknown:
        raise BadRequest(400, f"unknown field(s) for task {task}: {', '.join(sorted(map(ascii, unknown)))}")
    return texts, kwargs


def _json_object(body: bytes) -> dict:
    """The request body as a JSON object (400 naming what is wrong)."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"body is not valid UTF-8 JSON: {e}") from None
    except ValueError as e:  # also numbers of more than 4300 digits
        raise BadRequest(400, f"body is not valid UTF-8 JSON: {e}") from None
    except RecursionError:
        raise BadRequest(400, "body is not valid UTF-8 JSON: nested too deeply") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, 'body must be a JSON object, e.g. {"texts": ["..."]}')
    return payload


def _texts(payload: dict, max_batch: int) -> list[str]:
    """The request's texts: ``texts`` (a list of at most ``max_batch`` strings) or ``[text]``."""
    if ("texts" in payload) == ("text" in payload):
        raise BadRequest(400, 'give exactly one of "texts" (a list of strings) or "text" (a string)')
    texts = payload["texts"] if "texts" in payload else [payload["text"]]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest(400, '"texts" must be a list of strings and "text" a string')
    if len(texts) > max_batch:
        raise BadRequest(413, f"{len(texts)} texts exceed the limit of {max_batch} per request")
    _check_unicode(texts, "text")
    return texts


def _checked_field(spec: tuple, value):
    """``value`` of the optional field ``spec`` (see :func:`params`) if it has the spec's type and range, else 400."""
    name = spec[0]
    if spec[1] is bool and type(value) is not bool:
        raise BadRequest(400, f'"{name}" must be true or false')
    if len(spec) == 2 and spec[1] is not bool and value not in spec[1]:
        raise BadRequest(400, f'"{name}" must be one of {", ".join(spec[1])}')
    if len(spec) == 4 and (type(value) is not int or not spec[2] <= value <= spec[3]):
        raise BadRequest(400, f'"{name}" must be an integer in [{spec[2]}, {spec[3]}]')
    return value


def _text_pair(payload: dict, task: str, texts: list[str]) -> list[str]:
    """The second texts of a pair request: a string with ``text``, a list of strings (one per text) with ``texts``."""
    if task != "text-classification":
        raise BadRequest(400, f'"text_pair": task {task} takes single texts (pairs are for text-classification)')
    pair = payload["text_pair"]
    pairs = [pair] if "text" in payload and isinstance(pair, str) else pair
    if not (isinstance(pairs, list) and all(isinstance(t, str) for t in pairs)) or ("text" in payload) != isinstance(
        pair, str
    ):
        raise BadRequest(400, '"text_pair" must be a string with "text", or a list of strings with "texts"')
    if len(pairs) != len(texts):
        raise BadRequest(400, f'"text_pair" gives {len(pairs)} second texts for {len(texts)} texts; give one per text')
    _check_unicode(pairs, "text_pair")
    return pairs


def _tab_pairs(texts: list[str]) -> tuple[list[str], list[str]]:
    """A pair model's texts sent without ``text_pair``: each must be ``text<TAB>text_pair`` (400 otherwise)."""
    columns = [t.split("\t") for t in texts]
    bad = next((i for i, c in enumerate(columns) if len(c) != 2), None)
    if bad is not None:
        raise BadRequest(
            400,
            f"this model classifies sentence pairs: text {bad} is not text<TAB>text_pair; give "
            '"text_pair" (one second text per text)',
        )
    return [c[0] for c in columns], [c[1] for c in columns]


class Admission:
    """At most ``workers`` requests computed at once and ``queue`` more waiting; beyond, :class:`BadRequest` 503.

    Cost-aware: a heavy request (more tokens than one ONNX Runtime call takes) may hold at most ``workers - 1``
    places, running or waiting (1 with one worker), so light requests always find a worker of their own, and
    is admitted only while fewer than ``workers`` requests are (none waits for a worker): under load, heavy
    ones are shed first. Refused ones get 503 + Retry-After."""

    def __init__(self, workers: int, queue: int):
        self.workers, self.limit = workers, workers + queue
        self.heavy_limit = max(1, workers - 1)
        self.admitted = self.heavy = 0
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(workers)

    @contextmanager
    def slot(self, heavy: bool = False):
        with self.lock:
            if self.admitted >= self.limit:
                raise BadRequest(503, f"busy: {self.limit} requests already running or queued; retry later")
            if heavy and self.heavy >= self.heavy_limit:
                raise BadRequest(
                    503,
                    f"busy: {self.heavy_limit} large request(s) already running or queued "
                    f"(the other workers stay free for small ones); retry later",
                )
            if heavy and self.admitted >= self.workers:
                raise BadRequest(
                    503,
                    f"busy: {self.admitted} requests running or queued; a large request is taken only "
                    f"while a worker is free (small ones first); retry later",
                )
            self.admitted += 1
            self.heavy += heavy
        try:
            with self.slots:
                yield
        finally:
            with self.lock:
                self.admitted -= 1
                self.heavy -= heavy


def declared_length(headers, max_body_bytes: int) -> int:
    """The body length a request's headers declare, or :class:`BadRequest`: a chunked body (never read), no
    ``Content-Length``, one that is not a single number of at most 18 digits, or one over ``max_body_bytes``."""
    lengths = headers.get_all("Content-Length") or []
    if headers.get("Transfer-Encoding") is not None:
        raise BadRequest(411 if not lengths else 400, "Transfer-Encoding is not supported: send a Content-Length")
    if not lengths:
        raise BadRequest(411, "Content-Length is required")
    if len(lengths) > 1 or not DIGITS.fullmatch(lengths[0].strip()):
        raise BadRequest(400, "Content-Length must be one non-negative integer of at most 18 digits")
    length = int(lengths[0])
    if length > max_body_bytes:
        raise BadRequest(413, f"body of {length} bytes exceeds the limit of {max_body_bytes}")
    return length


@dataclass
class _Framing:
    """Where the first request in a connection's bytes ends: ``end`` bytes are the request to answer (its head,
    and its body when the body is to be read); ``body`` of them are body; ``expect``: the client waits for
    ``100 Continue`` before sending the body."""

    end: int
    body: int = 0
    expect: bool = False


def frame(data: bytes, max_body_bytes: int) -> _Framing | None:
    """How much of ``data`` the first request takes (:class:`_Framing`), or None while its head is incomplete.
    A request line that is not ``METHOD PATH VERSION``, an over-long one, a header the stdlib parser refuses
    or a body that will not be read (:func:`declared_length` refuses it, or none is declared) end the request
    with its head: the handler answers them at once. :class:`BadRequest` 431 for a head over :data:`HEAD_BYTES`."""
    line_end = data.find(b"\n", 0, MAX_LINE + 1)
    if line_end < 0:
        return _Framing(len(data)) if len(data) > MAX_LINE else None  # 414 from the handler
    words = data[:line_end].split()
    if len(words) != 3:
        return _Framing(line_end + 1)  # 400 from the handler, at once
    ends = [i for i in (data.find(b"\n\r\n", line_end), data.find(b"\n\n", line_end)) if i >= 0]
    if not ends:
        if len(data) > HEAD_BYTES:
            raise BadRequest(431, f"request head over {HEAD_BYTES} bytes")
        return None
    head_end = min(ends) + (3 if min(ends) == data.find(b"\n\r\n", line_end) else 2)
    try:
        headers = http.client.parse_headers(io.BytesIO(data[line_end + 1 : head_end]))
        length = declared_length(headers, max_body_bytes)
    except (http.client.HTTPException, BadRequest):
        return _Framing(head_end)  # refused or bodiless: the handler answers from the head alone
    expect = headers.get("Expect", "").lower() == "100-continue" and words[2] >= b"HTTP/1.1"
    return _Framing(head_end + length, length, expect and length > 0)


@dataclass(eq=False)
class _Conn:
    """An open connection: its socket, what it sent that is not yet answered, and when its time is up."""

    sock: socket.socket
    address: tuple
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    framing: _Framing | None = None  # the current request's, once its head is in
    continued: bool = False  # 100 Continue sent for the current request
    idle: bool = False  # kept alive between requests (counted in Server.idle)
    held: int = 0  # request bytes counted in Server.buffered for it (--max-buffered-bytes)
    closed: bool = False
    refusal: bytes | None = None  # over a cap: the answer it gets once its request is read (not counted as open)
    answered: bool = False  # the refusal was sent: what it sends now is drained until it closes


class Server(ThreadingHTTPServer):
    """One thread reads every connection's requests (a selector: a slow client costs a socket and its buffered
    bytes, never a thread); a request read whole is answered on a thread of its own. Connections that have not sent
    a whole request (headers and body) ``header_timeout`` seconds after they opened (or after their first byte
    following an idle wait) are closed, with a 408 if they had sent part of one; kept-alive connections idle for
    ``timeout`` seconds are closed. At most ``max_connections`` open and ``max_client_connections`` per client
    address; when full, the oldest idle kept-alive connection is closed to make room, and only then is a new one
    refused (503, read first; a ``GET /health`` is answered 200 even then). At most ``max_idle`` kept alive.
    The bytes of requests being read or answered are counted together (``buffered``): a request that would take
    them over ``max_buffered_bytes`` is shed with a 503."""

    daemon_threads = True
    request_queue_size = 1024
    quiet = False

    def __init__(self, address, handler, limits: dict):
        self.limits = limits
        self.max_connections, self.max_client_connections = limits["max_connections"], limits["max_client_connections"]
        self.max_idle = limits["max_idle"]
        self.buffered = 0  # request bytes held for every connection together (count_lock; _hold)
        # kept for small requests (HEAD_BYTES at most): they fit however many large ones stall (_hold)
        self.small_reserve = max(
            0, min(self.max_connections * HEAD_BYTES, limits["max_buffered_bytes"] - _largest_request(limits))
        )
        self.refusing = 0  # connections over a cap being read before their answer (reading thread only)
        self.per_client: dict[str, int] = {}
        self.open = self.idle = 0
        self.count_lock = threading.Lock()
        self._reading: dict[socket.socket, _Conn] = {}  # connections the reading thread waits on (its own)
        self._idle_conns: dict[_Conn, None] = {}  # the idle ones among them, oldest first (evicted first)
        self._parked: list[_Conn] = []  # kept alive by an answering thread, for the reading thread to take
        self._park_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop, self._stopped = threading.Event(), threading.Event()
        self._stopped.set()
        self._next_expiry = float("inf")
        self._accept_paused: float | None = None  # when accepting resumes, while out of file descriptors (_accept)
        self._selector = None
        super().__init__(address, handler)
        self.socket.setblocking(False)

    # -- the reading thread ---------------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ, None)
                selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
                with self._park_lock:
                    self._selector = selector
                try:
                    self._loop(poll_interval)
                finally:
                    with self._park_lock:
                        self._selector = None  # answering threads now close what they would keep alive
                    for conn in list(self._reading.values()):
                        self._close(conn, selector)
        finally:
            self._stop.clear()
            self._stopped.set()

    def _loop(self, poll_interval: float) -> None:
        while not self._stop.is_set():
            if self._accept_paused is not None and time.monotonic() >= self._accept_paused:
                self._accept_paused = None
                self._selector.register(self.socket, selectors.EVENT_READ, None)
            due = min(self._next_expiry, self._accept_paused or float("inf"))
            wait = min(poll_interval, max(0.0, due - time.monotonic()))
            for key, _ in self._selector.select(wait):
                if key.data is None:
                    self._accept()
                elif key.data is self._wake_r:
                    self._take_parked()
                elif self._reading.get(key.fileobj) is key.data:  # not closed earlier in this batch
                    self._receive(key.data)
            self._expire()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        with self._park_lock:
            parked, self._parked = self._parked, []
        for conn in parked:
            self._release(conn)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # closed, or a wake-up already pending fills its buffer
            pass

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, then the connections' turn
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of file descriptors, say: the socket rests, else every loop fails again at once
                if not self.quiet:  # (a busy loop writing this line 20,000 times a second)
                    sys.stderr.write(f"accept failed: {e}; accepting again in {ACCEPT_PAUSE_S} s\n")
                self._selector.unregister(self.socket)
                self._accept_paused = time.monotonic() + ACCEPT_PAUSE_S
                return
            self._admit(sock, address)

    def _admit(self, sock, address) -> None:
        """Count the new connection and start reading it; or close an idle one for it; or refuse it."""
        host = address[0]
        if self.open >= self.max_connections and self._idle_conns:  # idle keep-alive connections go first
            oldest = next(iter(self._idle_conns))
            self._drop(oldest)
            self._release(oldest)
        with self.count_lock:
            mine = self.per_client.get(host, 0) < self.max_client_connections
            room = mine and self.open < self.max_connections
            if room:
                self.per_client[host] = self.per_client.get(host, 0) + 1
                self.open += 1
        if not room:
            why = (
                "too many open connections"
                if mine
                else f"more than {self.max_client_connections} connections from {host}"
            )
            self._refuse(sock, address, _raw_response(503, {"error": f"busy: {why}; retry later"}))
            return
        self._watch(_Conn(sock, address, time.monotonic() + self.limits["header_timeout"]))

    def _watch(self, conn: _Conn) -> None:
        conn.sock.setblocking(False)
        self._reading[conn.sock] = conn
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        self._next_expiry = min(self._next_expiry, conn.deadline)

    def _drop(self, conn: _Conn, selector=None) -> None:
        """Stop watching ``conn`` (reading thread only)."""
        if self._reading.pop(conn.sock, None) is not None:
            (selector or self._selector).unregister(conn.sock)
        self._idle_conns.pop(conn, None)

    def _release(self, conn: _Conn) -> None:
        """Close ``conn`` and uncount it (any thread; it must no longer be watched)."""
        self.shutdown_request(conn.sock)
        self._uncount(conn)

    def _uncount(self, conn: _Conn) -> None:
        with self.count_lock:
            if conn.closed:
                return
            conn.closed = True
            self.buffered -= conn.held
            conn.held = 0
            self.open -= 1
            self.per_client[conn.address[0]] -= 1
            if not self.per_client[conn.address[0]]:
                del self.per_client[conn.address[0]]
            if conn.idle:
                conn.idle = False
                self.idle -= 1

    def _receive(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client closed (or reset) its side
            self._close(conn)
            return
        if conn.refusal is not None:
            self._refused_bytes(conn, chunk)
            return
        if conn.idle:  # a next request begins: it has header_timeout seconds from now
            self._idle_conns.pop(conn, None)
            self._leave_idle(conn)
            conn.deadline = time.monotonic() + self.limits["header_timeout"]
            self._next_expiry = min(self._next_expiry, conn.deadline)
        conn.data += chunk
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Hand ``conn``'s request to an answering thread once it is whole (sending ``100 Continue`` if asked); shed
        it with a 503 when its bytes (a body counted whole once its head declares it) would take the server over
        ``--max-buffered-bytes``."""
        try:
            conn.framing = conn.framing or frame(conn.data, self.limits["max_body_bytes"])
        except BadRequest as e:
            self._answer_and_close(conn, e.status, str(e))
            return
        framing = conn.framing
        if not self._hold(conn, max(len(conn.data), framing.end if framing else 0)):
            self._shed(conn)
            return
        if framing is None:
            return
        if len(conn.data) < framing.end:
            if framing.expect and not conn.continued:
                conn.continued = True
                _send_now(conn.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        request = bytes(conn.data[: framing.end])
        del conn.data[: framing.end]
        conn.framing, conn.continued = None, False
        self._drop(conn)
        conn.sock.setblocking(True)
        threading.Thread(target=self._answer, args=(conn, request), daemon=True).start()

    def _hold(self, conn: _Conn, held: int) -> bool:
        """Count ``held`` request bytes for ``conn`` (any thread that owns it); False, changing nothing, when that
        takes every connection's together over ``--max-buffered-bytes``, or, for a request over :data:`HEAD_BYTES`,
        into :attr:`small_reserve`: small requests, at most that much on all connections together, then always fit,
        where stalled large ones once took the whole buffer and every client's request got 503."""
        limit = self.limits["max_buffered_bytes"] - (self.small_reserve if held > HEAD_BYTES else 0)
        with self.count_lock:
            more = held - conn.held
            if more > 0 and self.buffered + more > limit:
                return False
            self.buffered += more
            conn.held = held
            return True

    def _shed(self, conn: _Conn) -> None:
        """``conn``'s request would take the server over ``--max-buffered-bytes``: uncounted, answered 503 (a
        ``GET /health`` 200) and drained until it closes, as a connection over a cap is."""
        self._drop(conn)
        self._uncount(conn)
        limit = self.limits["max_buffered_bytes"]
        answer = _raw_response(
            503, {"error": f"busy: {limit} bytes of requests held already (--max-buffered-bytes); retry later"}
        )
        refused = self._refuse(conn.sock, conn.address, answer)
        if refused is not None:
            refused.data = conn.data[: conn.data.find(b"\n") + 1]  # its request line: /health is answered 200
            self._send_refusal(refused)

    def _expire(self) -> None:
        """Close the connections whose time is up: a 408 to one that sent part of a request, nothing to others."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        self._next_expiry = float("inf")
        for conn in list(self._reading.values()):
            if conn.deadline > now:
                self._next_expiry = min(self._next_expiry, conn.deadline)
            elif conn.refusal is not None and not conn.answered:  # its request never came whole: answered anyway
                self._send_refusal(conn)
            elif conn.data and not conn.idle and conn.refusal is None:
                self._answer_and_close(conn, 408, self._late(conn))
            else:
                self._close(conn)

    def _late(self, conn: _Conn) -> str:
        seconds, framing = self.limits["header_timeout"], conn.framing
        if framing is None:
            return f"request headers not received within {seconds} s (--header-timeout)"
        got = len(conn.data) - (framing.end - framing.body)
        return f"body not received within {seconds} s ({got} of {framing.body} bytes; --header-timeout)"

    def _answer_and_close(self, conn: _Conn, status: int, message: str) -> None:
        _send_now(conn.sock, _raw_response(status, {"error": message}, retry=False))
        self._close(conn)

    def _close(self, conn: _Conn, selector=None) -> None:
        """Stop watching ``conn`` and close it (reading thread only)."""
        self._drop(conn, selector)
        if conn.refusal is None:
            self._release(conn)
        else:
            self.shutdown_request(conn.sock)
            self.refusing -= 1

    def _take_parked(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self._park_lock:
            parked, self._parked = self._parked, []
        for conn in parked:
            pipelined = bool(conn.data)
            if pipelined:  # the next request is already here: not idle
                self._leave_idle(conn)
            seconds = self.limits["header_timeout"] if pipelined else self.limits["timeout"]
            conn.deadline = time.monotonic() + seconds
            self._watch(conn)
            if conn.idle:
                self._idle_conns[conn] = None
            if pipelined:
                self._advance(conn)

    # -- answering threads ----------------------------------------------------------------------------------------

    def _answer(self, conn: _Conn, request: bytes) -> None:
        keep = False
        try:
            keep = not self.RequestHandlerClass(conn, request, self).close_connection
        except Exception:
            self.handle_error(conn.sock, conn.address)
        if not keep:
            self._release(conn)
            return
        self._hold(conn, len(conn.data))  # the answered request's bytes are free; a pipelined next one's stay counted
        with self._park_lock:
            if self._selector is not None:
                self._parked.append(conn)
                conn = None
        if conn is not None:  # the server stopped meanwhile
            self._release(conn)
        else:
            self._wake()

    def enter_idle(self) -> bool:
        """Count one more connection kept alive for a next request; False (close it) when ``max_idle`` are."""
        with self.count_lock:
            if self.idle >= self.max_idle:
                return False
            self.idle += 1
            return True

    def _leave_idle(self, conn: _Conn) -> None:
        with self.count_lock:
            if conn.idle:
                conn.idle = False
                self.idle -= 1

    # -- connections over a cap -----------------------------------------------------------------------------------

    def _refuse(self, sock, address, answer: bytes) -> _Conn | None:
        """A connection over a cap gets ``answer`` (a 503 with ``Connection: close``) once its request is read (or
        :data:`REFUSE_READ_S` passed), then what it sends is drained until it closes: closing with unread bytes would
        make the kernel reset it, which the client sees as a dropped connection, not as the 503. Read by the
        reading thread like any other, so a client reconnecting at once costs no thread and waits its turn. Returns
        the refused connection being read (None: answered at once)."""
        if self.refusing >= REFUSING:  # too many at once: answered now, unread
            _send_now(sock, answer)
            self.shutdown_request(sock)
            return None
        self.refusing += 1
        conn = _Conn(sock, address, time.monotonic() + REFUSE_READ_S, refusal=answer)
        self._watch(conn)
        return conn

    def _refused_bytes(self, conn: _Conn, chunk: bytes) -> None:
        if conn.answered:
            return  # drained
        conn.data += chunk
        if _request_read(conn.data) or len(conn.data) >= DRAIN_BYTES:  # what it holds: under DRAIN_BYTES + a receive
            self._send_refusal(conn)

    def _send_refusal(self, conn: _Conn) -> None:
        """The refusal, or 200 to a ``GET /health`` (the process is healthy, however many connections are open)."""
        healthy = HEALTH.fullmatch(bytes(conn.data[: conn.data.find(b"\n")]))
        _send_now(conn.sock, _raw_response(200, {"status": "ok"}, retry=False) if healthy else conn.refusal)
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # the answer is complete: the client reads it, then end of stream
        except OSError:
            pass
        conn.answered, conn.data = True, bytearray()
        conn.deadline = time.monotonic() + REFUSE_READ_S  # for the client to close its side
        self._next_expiry = min(self._next_expiry, conn.deadline)

    def handle_error(self, request, client_address):
        """One line on stderr (a client that went away, say), never a traceback."""
        if not self.quiet:
            error = sys.exc_info()[1]
            sys.stderr.write(f"{client_address[0]} - connection error: {type(error).__name__}: {error}\n")


def _send_now(sock, data: bytes) -> None:
    """Send a short answer without waiting (the reading thread never blocks on a client): what the socket's buffer
    takes now, best effort; a client that does not read is closed all the same."""
    try:
        sock.send(data)
    except OSError:
        pass


HEALTH = re.compile(rb"GET /health HTTP/1\.[01]\r?")  # a request line (the whole first line of a refused request)


def _request_read(data: bytes) -> bool:
    """Whether ``data`` holds a request's head and its body (at most :data:`DRAIN_BYTES` of it are waited for)."""
    head, blank, body = bytes(data).partition(b"\r\n\r\n")
    if not blank:
        return len(data) >= DRAIN_BYTES
    length = re.search(rb"(?im)^content-length:\s*([0-9]{1,18})\s*$", head)
    return len(body) >= min(int(length.group(1)) if length else 0, DRAIN_BYTES)


def _raw_response(status: int, payload: dict, retry: bool = True) -> bytes:
    body = json.dumps(payload, allow_nan=False).encode("utf-8")
    after = f"Retry-After: {RETRY_AFTER_S}\r\n" if retry else ""
    return (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{after}Connection: close\r\n\r\n"
    ).encode() + body


def make_server(runtime, host: str = "127.0.0.1", port: int = 8000, quiet: bool = False, **limits) -> Server:
    """A threading HTTP server answering ``runtime``'s task (call ``serve_forever()``).

    ``limits``: any of :data:`LIMITS` (``max_batch=64``, ``max_tokens=8192``, ...), each a positive
    integer; ``max_batch_tokens`` is set on ``runtime``.
    """
    limits = _checked_limits(limits)
    runtime.max_batch_tokens = limits["max_batch_tokens"]
    task_path = TASK_PATHS[runtime.task]
    service = _Service(
        runtime,
        limits,
        task_path,
        {**runtime.metadata(), "endpoint": task_path, **limits},
        Admission(limits["workers"], limits["max_queue"]),
        inspect.signature(runtime.fill_mask).parameters["top_k"].default,
        quiet,
    )
    server = Server((host, port), Handler, limits)
    server.quiet, server.admission, server.service = quiet, service.admission, service
    return server


def _checked_limits(limits: dict) -> dict:
    """Every limit of :data:`LIMITS`, the given ones checked to be positive integers and the rest defaults."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise TypeError(f"unknown limit(s): {', '.join(sorted(unknown))}")
    limits = {name: limits.get(name, default) for name, (default, _) in LIMITS.items()}
    for name, value in limits.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    _check_buffered(limits)
    return limits


def _largest_request(limits: dict) -> int:
    """The most bytes one request taken may hold: a body of ``--max-body-bytes`` and a whole head."""
    return limits["max_body_bytes"] + HEAD_BYTES


def _check_buffered(limits: dict) -> None:
    """``--max-buffered-bytes`` holds at least one request of the largest size taken (a body and a whole head)."""
    least = _largest_request(limits)
    if limits["max_buffered_bytes"] < least:
        raise ValueError(
            f"--max-buffered-bytes {limits['max_buffered_bytes']} holds no request of --max-body-bytes "
            f"{limits['max_body_bytes']} and its head ({HEAD_BYTES} bytes): give at least {least}"
        )


def _check_open_files(max_connections: int) -> None:
    """The process may open a file descriptor for every connection it keeps (``--max-connections``, and the
    :data:`REFUSING` ones read before their 503) and :data:`SPARE_FILES` more: its soft limit is raised as far as
    the hard one allows; below that, refused in one line (out of descriptors, every accept failed, over and over)."""
    import resource

    need = max_connections + REFUSING + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(hard, need)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        raise ValueError(
            f"--max-connections {max_connections} needs {need} open files ({REFUSING} connections being refused and "
            f"{SPARE_FILES} more beside them); this process may open {soft} (ulimit -n): lower --max-connections to "
            f"{max(1, soft - REFUSING - SPARE_FILES)} or raise ulimit -n"
        )


@dataclass(frozen=True)
class _Service:
    """What a :class:`Handler` answers with (``server.service``): the runtime, the limits and what follows."""

    runtime: object
    limits: dict
    task_path: str  # the task's own POST path, besides /predict
    metadata: dict  # GET /metadata
    admission: Admission
    default_top_k: int
    quiet: bool


class Handler(BaseHTTPRequestHandler):
    """One connection's requests, answered from ``self.server.service`` (:class:`_Service`)."""

    server_version = "sharebert-serve"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: the body, written after the head, is not held back by Nagle
    # until the client's delayed ACK of the head (40 ms on Linux: one-sentence answers took 48 ms instead of 8)
    default_request_version = "HTTP/1.0"  # refusals of unreadable request lines still get a status line

    def __init__(self, conn: _Conn, request: bytes, server: Server):
        self.conn, self.raw = conn, request
        super().__init__(conn.sock, conn.address, server)

    @property
    def service(self) -> _Service:
        return self.server.service

    def setup(self):
        self.timeout = self.service.limits["timeout"]  # an answer waits at most this long for a client to read it
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self.raw)  # the whole request, read by the server's reading thread

    def handle(self):
        """One request: a kept-alive connection goes back to the reading thread for the next one."""
        self.close_connection = True
        self.handle_one_request()

    def _send(self, status: int, payload: dict) -> None:
        try:  # strict JSON: a non-finite number is never written as NaN
            body = json.dumps(payload, allow_nan=False).encode("utf-8")
        except ValueError:
            status, body = (
                500,
                json.dumps(
                    {
                        "error": "internal error: the model's output is not finite "
                        "(NaN or infinity); the artifact's weights may be corrupt"
                    }
                ).encode(),
            )
        if not self.close_connection and not self.conn.idle:
            self.conn.idle = self.server.enter_idle()  # over max_idle: this answer closes the connection
            self.close_connection = not self.conn.idle
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", str(RETRY_AFTER_S))
        if self.close_connection:
            self.send_header("Connection", "close")  # the client then reconnects rather than reuse a dead socket
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own refusals (bad request line, unknown method) as JSON 4xx, never HTML or 5xx."""
        self.close_connection = True
        if code == HTTPStatus.NOT_IMPLEMENTED:  # an unsupported method is the client's error
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} not allowed; use GET or POST"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code, message = HTTPStatus.BAD_REQUEST, f"{message}; this server speaks HTTP/1.0 and HTTP/1.1"
        self._send(int(code), {"error": message or explain or HTTPStatus(code).phrase})

    def parse_request(self):
        words = self.raw_requestline.split()
        if len(words) != 3:  # blank, HTTP/0.9 (no version: no status line either) or garbage
            self.command, self.request_version = None, self.default_request_version
            self.requestline = str(self.raw_requestline[:80], "iso-8859-1").rstrip("\r\n")  # for the log line
            self.send_error(400, f"bad request line {self.raw_requestline[:80]!r}; expected METHOD PATH HTTP/1.1")
            return False
        return super().parse_request()

    def handle_expect_100(self):
        """Nothing to send: the reading thread sent ``100 Continue`` for a body it was to read (:func:`frame`), and
        a refused one is answered at once (do_POST), the client never sending the body."""
        return True

    def _length(self) -> int:
        """The declared body length; raises :class:`BadRequest` (and marks the connection for closing: a body not
        read must never be parsed as the next request)."""
        try:
            return declared_length(self.headers, self.service.limits["max_body_bytes"])
        except BadRequest:
            self.close_connection = True
            raise

    def _read_body(self, length: int) -> bytes:
        """The body, read whole by the reading thread before this request was handed over (a slow sender got 408)."""
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            raise BadRequest(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def _drain(self) -> None:
        """After a refusal sent before the body: read a little of it so the client sees the answer, not a reset."""
        try:
            self.connection.settimeout(1)
            self.connection.recv(DRAIN_BYTES)  # at most 1 s
        except OSError:
            pass

    def do_GET(self):
        task_path = self.service.task_path
        if self.headers.get("Transfer-Encoding") is not None or self.headers.get("Content-Length", "0").strip() != "0":
            self.close_connection = True  # a body we do not read must never be parsed as the next request
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/metadata":
            self._send(200, self.service.metadata)
        elif self.path in ("/predict", task_path):
            self._send(405, {"error": f"use POST for {self.path}"})
        else:
            self._send(404, {"error": f"no endpoint {self.path[:200]}; try /health, /metadata, POST {task_path}"})

    def do_POST(self):
        from .runtime import shortest_floats

        try:
            try:
                length = self._length()
            except BadRequest as e:
                self._send(e.status, {"error": str(e)})
                self._drain()
                return
            body = self._read_body(length)  # read before any other check: keep-alive stays in step
            preds = self._predict(body)
        except BadRequest as e:
            self._send(e.status, {"error": str(e)})
            return
        except Exception as e:  # input was validated above: this is the server's fault
            self._send(500, {"error": f"internal error: {type(e).__name__}: {e}"})
            return
        results = [shortest_floats(p) if hasattr(p, "tolist") else p for p in preds]
        self._send(200, {"results": results, "truncated": preds.truncated})

    def _predict(self, body: bytes):
        """The runtime's predictions for a request body read whole; :class:`BadRequest` for a wrong path, a bad
        body or a request over the limits."""
        s = self.service
        runtime, limits = s.runtime, s.limits
        if self.path not in ("/predict", s.task_path):
            raise BadRequest(
                404 if self.path not in TASK_PATHS.values() else 400,
                f"no endpoint {self.path[:200]} for task {runtime.task}; POST /predict or {s.task_path}",
            )
        texts, kwargs = parse_request(
            body, runtime.task, limits["max_batch"], limits["max_top_k"], runtime.max_depth, runtime.pairs
        )
        model = runtime.at_depth(kwargs.pop("depth")) if "depth" in kwargs else runtime
        tokens, masks = runtime.request_size(texts, text_pair=kwargs.get("text_pair"))
        if tokens > limits["max_tokens"]:
            raise BadRequest(413, f"{tokens} tokens exceed the limit of {limits['max_tokens']} per request")
        top_k = kwargs.get("top_k", s.default_top_k)
        if runtime.task == "fill-mask" and masks * top_k > limits["max_candidates"]:
            raise BadRequest(
                413,
                f"{masks} [MASK] tokens x top_k {top_k} = {masks * top_k} candidates exceed "
                f"the limit of {limits['max_candidates']} per request (--max-candidates)",
            )
        heavy = tokens > limits["max_batch_tokens"]
        with s.admission.slot(heavy=heavy):
            preds = model.predict(texts, **kwargs)
            if heavy:
                give_back()  # a large request's freed blocks go back to the OS
        return preds

    def log_message(self, fmt, *args):
        if not self.service.quiet:
            sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")


def run(args) -> int:
    from .runtime import Runtime

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    limits = {name: getattr(args, name) for name in LIMITS}
    for name, value in limits.items():  # before loading the model: a typo costs no wait
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    _check_buffered(limits)
    _check_open_files(limits["max_connections"])
    limit_arenas(2)  # before any thread: one malloc arena per connection thread would keep each one's freed memory
    runtime = Runtime(args.artifact, threads=args.threads, ram=args.ram, manifest_sha256=args.pin, depth=args.depth)
    try:
        server = make_server(runtime, args.host, args.port, args.quiet, **limits)
    except OSError as e:  # port in use, address not on this machine, unknown host
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    host, port = server.server_address[:2]
    print(
        f"serving {runtime.task} from {args.artifact} on http://{host}:{port} "
        f"(POST {TASK_PATHS[runtime.task]} or /predict; GET /health, /metadata); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0

"""``sharebert serve``: a small local JSON service for an exported artifact (stdlib HTTP, no torch).

Endpoints:

* ``GET /health`` -> ``{"status": "ok"}``; ``GET /metadata`` -> task, labels, limits, RAM mode.
* ``POST /predict`` (and the task's own path: ``/fill-mask``, ``/classify``, ``/embed`` or
  ``/generate``) with ``{"texts": [...]}`` or ``{"text": "..."}`` and optional ``top_k``,
  ``pooling`` or ``max_new_tokens`` -> ``{"results": [...], "truncated": n}``.

Bad input gets a 4xx with ``{"error": message}``: 400 bad JSON or fields, 404/405 wrong path or
method, 411 no length, 413 body or batch over the limits.
"""
from __future__ import annotations

import json
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HELP = "serve an exported artifact over local HTTP/JSON (/predict, /health, /metadata) without torch"

TASK_PATHS = {"fill-mask": "/fill-mask", "text-classification": "/classify", "feature-extraction": "/embed",
              "causal-lm": "/generate"}
# Optional request fields per task: (name, type, lowest, highest) or (name, allowed values).
PARAMS = {"fill-mask": [("top_k", int, 1, 100)], "feature-extraction": [("pooling", ("cls", "mean"))],
          "causal-lm": [("max_new_tokens", int, 0, 256)], "text-classification": []}
DISCARD_LIMIT = 64 << 20  # refused bodies up to this size are drained; larger ones just close the connection


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def add_arguments(p):
    p.add_argument("artifact", help="artifact folder written by `sharebert export`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads per request")
    p.add_argument("--ram", choices=("fp32", "int8"), default="fp32", help="see `sharebert predict --help`")
    p.add_argument("--max-batch", type=int, default=64, help="most texts per request (default: 64)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default: 1 MiB)")
    p.add_argument("--quiet", action="store_true", help="do not log each request")
    p.add_argument("--pin", metavar="SHA256", help="refuse the artifact unless manifest.json has this sha256")


def parse_request(body: bytes, task: str, max_batch: int) -> tuple[list[str], dict]:
    """Request body -> ``(texts, task keyword arguments)``; raises :class:`BadRequest`."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(400, f"body is not valid UTF-8 JSON: {e}") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, 'body must be a JSON object, e.g. {"texts": ["..."]}')
    if ("texts" in payload) == ("text" in payload):
        raise BadRequest(400, 'give exactly one of "texts" (a list of strings) or "text" (a string)')
    texts = payload["texts"] if "texts" in payload else [payload["text"]]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest(400, '"texts" must be a list of strings and "text" a string')
    if len(texts) > max_batch:
        raise BadRequest(413, f"{len(texts)} texts exceed the limit of {max_batch} per request")
    kwargs = {}
    for spec in PARAMS[task]:
        name = spec[0]
        if name not in payload:
            continue
        value = payload[name]
        if len(spec) == 2 and value not in spec[1]:
            raise BadRequest(400, f'"{name}" must be one of {", ".join(spec[1])}')
        if len(spec) == 4 and (type(value) is not int or not spec[2] <= value <= spec[3]):
            raise BadRequest(400, f'"{name}" must be an integer in [{spec[2]}, {spec[3]}]')
        kwargs[name] = value
    unknown = set(payload) - {"text", "texts"} - {s[0] for s in PARAMS[task]}
    if unknown:
        raise BadRequest(400, f"unknown field(s) for task {task}: {', '.join(sorted(unknown))}")
    return texts, kwargs


def make_server(runtime, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 64,
                max_body_bytes: int = 1 << 20, quiet: bool = False) -> ThreadingHTTPServer:
    """A threading HTTP server answering ``runtime``'s task (call ``serve_forever()``)."""
    if max_batch < 1 or max_body_bytes < 1:
        raise ValueError("--max-batch and --max-body-bytes must be positive")
    task_path = TASK_PATHS[runtime.task]
    metadata = {**runtime.metadata(), "endpoint": task_path, "max_batch": max_batch, "max_body_bytes": max_body_bytes}

    class Handler(BaseHTTPRequestHandler):
        server_version = "sharebert-serve"
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds a connection may sit idle or half-sent before its thread gives up

        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")  # the client then reconnects rather than reuse a dead socket
            self.end_headers()
            self.wfile.write(body)

        def send_error(self, code, message=None, explain=None):
            """The stdlib's own refusals (bad request line, unknown method) as JSON 4xx, never HTML or 5xx."""
            self.close_connection = True
            if code == HTTPStatus.NOT_IMPLEMENTED:  # an unsupported method is the client's error
                code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} not allowed; use GET or POST"
            self._send(int(code), {"error": message or explain or HTTPStatus(code).phrase})

        def _discard(self, length: int) -> None:
            """Read and drop a refused body in chunks (bounded memory) so the client sees the 4xx."""
            while 0 < length <= DISCARD_LIMIT:
                chunk = self.rfile.read(min(length, 1 << 16))
                if not chunk:
                    break
                length -= len(chunk)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/metadata":
                self._send(200, metadata)
            elif self.path in ("/predict", task_path):
                self._send(405, {"error": f"use POST for {self.path}"})
            else:
                self._send(404, {"error": f"no endpoint {self.path}; try /health, /metadata, POST {task_path}"})

        def do_POST(self):
            try:
                length = self.headers.get("Content-Length")
                if length is None:
                    self.close_connection = True  # e.g. a chunked body: never parse it as the next request
                    raise BadRequest(411, "Content-Length is required")
                if not length.isdigit():
                    self.close_connection = True
                    raise BadRequest(400, "Content-Length must be a non-negative integer")
                if int(length) > max_body_bytes:
                    self.close_connection = True
                    self._discard(int(length))
                    raise BadRequest(413, f"body of {length} bytes exceeds the limit of {max_body_bytes}")
                body = self.rfile.read(int(length))  # read before any other check: keep-alive stays in step
                if self.path not in ("/predict", task_path):
                    raise BadRequest(404 if self.path not in TASK_PATHS.values() else 400,
                                     f"no endpoint {self.path} for task {runtime.task}; POST /predict or {task_path}")
                texts, kwargs = parse_request(body, runtime.task, max_batch)
            except BadRequest as e:
                self._send(e.status, {"error": str(e)})
                return
            try:
                preds = runtime.predict(texts, **kwargs)
            except Exception as e:  # input was validated above: this is the server's fault
                self._send(500, {"error": f"internal error: {type(e).__name__}: {e}"})
                return
            results = [p.tolist() if hasattr(p, "tolist") else p for p in preds]
            self._send(200, {"results": results, "truncated": preds.truncated})

        def log_message(self, fmt, *args):
            if not quiet:
                sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def run(args) -> int:
    from .runtime import Runtime

    runtime = Runtime(args.artifact, threads=args.threads, ram=args.ram, manifest_sha256=args.pin)
    server = make_server(runtime, args.host, args.port, args.max_batch, args.max_body_bytes, args.quiet)
    host, port = server.server_address[:2]
    print(f"serving {runtime.task} from {args.artifact} on http://{host}:{port} "
          f"(POST {TASK_PATHS[runtime.task]} or /predict; GET /health, /metadata); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0

"""``sharebert serve`` on 127.0.0.1: endpoints, 4xx for bad input, and a short concurrent load."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import Runtime
from sharebert_runtime.serve import make_server

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=16, runs=3, progress=False)  # a short parity check and footprint timing


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(base URL, runtime) of a fill-mask service on a free loopback port."""
    root = tmp_path_factory.mktemp("serve")
    build_model("sharebert-tiny", root / "model", TINY, seed=1)
    export_model(root / "model", root / "artifact", task="fill-mask", **QUICK)
    runtime = Runtime(root / "artifact", threads=1)
    server = make_server(runtime, "127.0.0.1", 0, quiet=True, max_batch=8, max_body_bytes=4096)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", runtime
    server.shutdown()
    server.server_close()


def _call(url, body=None, method=None, headers=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_and_metadata(service):
    url, runtime = service
    assert _call(url + "/health") == (200, {"status": "ok"})
    status, meta = _call(url + "/metadata")
    assert status == 200 and meta["task"] == "fill-mask" and meta["max_batch"] == 8 and meta["endpoint"] == "/fill-mask"
    assert meta["max_length"] == runtime.max_length


def test_bad_input_gets_4xx_with_a_message(service):
    url, _ = service
    cases = [
        (b"{not json", 400, "not valid UTF-8 JSON"),
        (b"\xff\xfe", 400, "not valid UTF-8 JSON"),
        ({"texts": "one string"}, 400, "list of strings"),
        ({"texts": ["a", 3]}, 400, "list of strings"),
        ({"text": "a", "texts": ["b"]}, 400, "exactly one"),
        ([1, 2], 400, "JSON object"),
        ({"text": "a [MASK]", "top_k": 0}, 400, "top_k"),
        ({"text": "a [MASK]", "top_k": "3"}, 400, "top_k"),
        ({"text": "a", "pooling": "mean"}, 400, "unknown field"),
        ({"texts": ["x"] * 9}, 413, "limit of 8"),
        ({"text": "y" * 5000}, 413, "exceeds the limit of 4096"),
    ]
    for body, code, message in cases:
        status, reply = _call(url + "/predict", body)
        assert status == code and message in reply["error"], (body, status, reply)
    assert _call(url + "/nowhere")[0] == 404
    assert _call(url + "/predict")[0] == 405
    assert _call(url + "/classify", {"text": "a"})[0] == 400  # another task's endpoint


def test_concurrent_requests_all_answered_correctly(service):
    url, runtime = service
    requests = [[f"request {i} says the [MASK] is {'very ' * (i % 5)}near .", ""] for i in range(40)]
    expected = [runtime.fill_mask(texts, top_k=2) for texts in requests]

    def ask(i):
        return _call(url + ("/fill-mask" if i % 2 else "/predict"), {"texts": requests[i], "top_k": 2})

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(ask, range(len(requests))))
    for (status, reply), want in zip(replies, expected):
        assert status == 200 and reply["truncated"] == 0
        assert reply["results"] == json.loads(json.dumps(list(want)))


def test_keep_alive_stays_in_step_after_early_4xx(service):
    """An error sent before the body is read must not leave that body to be parsed as the next request."""
    url, runtime = service
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"text": "a [MASK] film"}).encode()
    replies = []
    for path in ("/nowhere", "/classify", "/fill-mask"):
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        replies.append((r.status, json.loads(r.read())))
    assert [s for s, _ in replies] == [404, 400, 200]
    assert "no endpoint /classify" in replies[1][1]["error"]
    conn2 = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn2.request("POST", "/fill-mask", iter([body]), {"Transfer-Encoding": "chunked"})
    r = conn2.getresponse()
    assert r.status == 411 and r.getheader("Connection") == "close"
    r.read()
    conn2.request("GET", "/health")
    assert (lambda r: (r.status, json.loads(r.read())))(conn2.getresponse()) == (200, {"status": "ok"})


def test_protocol_errors_are_json_4xx(service):
    url, _ = service
    assert _call(url + "/health", method="PUT") == (405, {"error": "method PUT not allowed; use GET or POST"})
    import socket

    host, port = url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n" + b"X-Filler: 1\r\n" * 120 + b"\r\n")  # over the stdlib's 100 headers
        reply = b"".join(iter(lambda: s.recv(4096), b"")).decode()  # the server closes after a refusal
    head, _, body = reply.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 431") and "application/json" in head and "error" in json.loads(body)

"""What an async HTTP server would cost ``sharebert serve`` on a device, beside today's stdlib server, in one run:
each one's import (seconds and peak RSS, ``/usr/bin/time``) and the RSS of a ``GET /health``-only server of its kind
after 20 requests (``VmRSS``), ``--rounds`` times, alternating.

Today's: ``sharebert_runtime.serve``'s own ``Server`` (the selector reading thread) with its ``Handler``, from this
checkout's interpreter. The others (uvicorn, hypercorn, aiohttp, with a one-endpoint app each) from ``--python``, an
interpreter of the same version with them installed, e.g.::

    python -m venv /tmp/asyncvenv && /tmp/asyncvenv/bin/pip install uvicorn hypercorn aiohttp
    OMP_NUM_THREADS=1 python benchmarks/serve_servers_footprint.py --python /tmp/asyncvenv/bin/python
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

IMPORTS = {
    "stdlib (today's)": "import sharebert_runtime.serve",
    "uvicorn": "import uvicorn",
    "hypercorn": "import hypercorn.asyncio, hypercorn.config",
    "aiohttp": "import aiohttp.web",
}
ASGI = """
async def app(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"status": "ok"}'})
"""
SERVERS = {  # a /health-only server of each kind on 127.0.0.1:PORT
    "stdlib (today's)": (
        "import types\n"
        "from sharebert_runtime.serve import LIMITS, Handler, Server\n"
        "limits = {k: v for k, (v, _) in LIMITS.items()}\n"
        "server = Server(('127.0.0.1', PORT), Handler, limits)\n"
        "server.quiet, server.service = True, types.SimpleNamespace(task_path='/x', limits=limits, quiet=True)\n"
        "server.serve_forever()\n"
    ),
    "uvicorn": f"import uvicorn\n{ASGI}\nuvicorn.run(app, host='127.0.0.1', port=PORT, log_level='error')\n",
    "hypercorn": (
        f"import asyncio\nfrom hypercorn.asyncio import serve\nfrom hypercorn.config import Config\n{ASGI}\n"
        "c = Config()\nc.bind, c.loglevel = [f'127.0.0.1:{PORT}'], 'ERROR'\nasyncio.run(serve(app, c))\n"
    ),
    "aiohttp": (
        "from aiohttp import web\n"
        "async def health(request):\n    return web.json_response({'status': 'ok'})\n"
        "a = web.Application()\na.router.add_get('/health', health)\n"
        "web.run_app(a, host='127.0.0.1', port=PORT, print=None)\n"
    ),
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/health")
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def imported(python: str, code: str) -> tuple[float, float]:
    """(seconds, peak RSS MB) of a fresh interpreter running ``code``."""
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", python, "-c", code], capture_output=True, text=True)
    seconds, kb = done.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(kb) / 1024


def serving(python: str, code: str, port: int) -> float:
    """RSS MB of a /health server after 20 requests."""
    proc = subprocess.Popen([python, "-c", f"PORT = {port}\n{code}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # until it listens (a bound against a hang only)
            try:
                health(port)
                break
            except OSError:
                time.sleep(0.1)
        assert all(health(port) == 200 for _ in range(20))
        return rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True, help="an interpreter with uvicorn, hypercorn and aiohttp installed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18700, help="first of the ports used (one per server and round)")
    args = ap.parse_args(argv)
    rows = {name: [] for name in IMPORTS}
    port = args.port
    for _ in range(args.rounds):
        for name in IMPORTS:
            python = sys.executable if name.startswith("stdlib") else args.python
            rows[name].append((*imported(python, IMPORTS[name]), serving(python, SERVERS[name], port)))
            port += 1
    print("\n| server | import s | import peak RSS MB | /health server RSS MB |")
    print("|---|---|---|---|")
    for name, runs in rows.items():
        cols = [", ".join(f"{r[i]:.{1 if i else 2}f}" for r in runs) for i in range(3)]
        print(f"| {name} | {cols[0]} | {cols[1]} | {cols[2]} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

"""Load test of the HTTP server (`sessrec.deploy.server`) on loopback: latency and requests/s, then bad requests.

Starts ``serve(--model-dir)`` in a subprocess on a free 127.0.0.1 port (server torch threads:
`--threads`), waits for ``/health``, and at each `--concurrency` level runs that many async
clients (httpx) sending one-session ``/recommend`` requests until `--requests` are answered or
`--seconds` have passed, after `--warmup` requests one at a time. Sessions are prefixes of random
length of the sessions in `--data` (rsc15_100k's test day; raw ids, as a request carries them),
or of random vocabulary ids when the file is missing. The server's ``/metadata`` counters, read
before and after each level, give the sessions scored per model call (the dynamic batching).

Then it sends the malformed requests (broken JSON, wrong types, empty session, unknown id with
``on_unknown: "error"``, 10,000 items, bodies over the byte limit with and without
Content-Length) and checks that each gets a 4xx and that ``/health`` still answers. Exits 1 when
a load request failed, a bad request got anything but a 4xx, or the server went down.

One JSON line per concurrency level, then one for the bad requests. Client and server share the
machine's cores, so requests/s at high concurrency includes the client's own CPU time.

Example (from the repository root):
    python benchmarks/serve_load.py                                     # runs/pipeline_rsc15/pipeline
    python benchmarks/serve_load.py --model-dir <dir> --concurrency 1 4 16 --requests 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared/data/rsc15_100k/yoochoose-clicks-100k_test.txt.gz"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    code = (
        f"import torch; torch.set_num_threads({args.threads})\n"
        "from sessrec.deploy.server import serve\n"
        f"serve({str(args.model_dir)!r}, port={port}, max_batch_size={args.max_batch_size}, "
        f"max_wait_ms={args.max_wait_ms}, log_level='warning', access_log=False)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode} before answering /health")
        try:
            reply = httpx.get(f"{url}/health", timeout=1.0)
            if reply.status_code == 200:
                return reply.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no answer from {url}/health within {timeout_s:.0f} s")


def request_sessions(data: Path, n: int, seed: int = 0) -> list[list[int]]:
    """`n` session prefixes (raw ids, oldest first) from a SessionId/ItemId/Time click file."""
    table = pacsv.read_csv(data, parse_options=pacsv.ParseOptions(delimiter="\t")).to_pandas()
    table = table.sort_values(["SessionId", "Time"], kind="stable")
    sessions = [g.tolist() for _, g in table.groupby("SessionId", sort=False)["ItemId"]]
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, len(sessions), n)
    return [sessions[i][: int(rng.integers(1, len(sessions[i]) + 1))] for i in picked]


def vocabulary_sessions(model_dir: Path, n: int, seed: int = 0) -> list[list[int]]:
    """`n` random sessions of 1-10 ids from the served pipeline's vocabulary (when there is no click file)."""
    from sessrec.data.vocab import ItemVocab

    raw = ItemVocab.load(model_dir / "vocab.parquet").raw_ids.slice(2).to_pylist()
    rng = np.random.default_rng(seed)
    return [[raw[i] for i in rng.integers(0, len(raw), int(rng.integers(1, 11)))] for _ in range(n)]


async def load_level(url: str, sessions: list[list[int]], concurrency: int, requests: int, seconds: float,
                     k: int) -> dict:
    """`concurrency` clients, each sending its next request as soon as the previous one is answered."""
    latencies: list[float] = []
    statuses: Counter = Counter()
    sent = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < requests and time.perf_counter() < deadline:
                session = sessions[sent % len(sessions)]
                sent += 1
                t = time.perf_counter()
                try:
                    reply = await client.post("/recommend", json={"session": session, "k": k})
                    ok = reply.status_code == 200 and len(reply.json()["recommendations"]) == 1
                    statuses[reply.status_code if ok else f"bad-{reply.status_code}"] += 1
                except httpx.HTTPError as err:
                    statuses[type(err).__name__] += 1
                    continue
                latencies.append((time.perf_counter() - t) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    times = np.array(latencies)
    errors = sum(n for status, n in statuses.items() if status != 200)
    return {
        "requests": int(sum(statuses.values())), "errors": errors, "wall_s": round(wall, 2),
        "requests_per_s": round(statuses[200] / wall, 1),
        "p50_ms": round(float(np.percentile(times, 50)), 2) if len(times) else None,
        "p99_ms": round(float(np.percentile(times, 99)), 2) if len(times) else None,
        "mean_ms": round(float(times.mean()), 2) if len(times) else None,
    }


async def chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """A body sent with chunked encoding (no Content-Length): the limit must hold on the bytes received."""
    yield b'{"session": ['
    for _ in range(total // size):
        yield b"1," * (size // 2)
    yield b"1]}"


def bad_requests(vocab_id: int, max_bytes: int) -> dict[str, dict]:
    """name -> httpx request arguments of each malformed request."""
    over = max_bytes + 1024
    return {
        "broken_json": {"content": b'{"session": [1, 2'},
        "not_an_object": {"json": [[vocab_id]]},
        "sessions_not_a_list": {"json": {"sessions": "abc"}},
        "session_not_a_list": {"json": {"sessions": [vocab_id]}},
        "k_not_an_int": {"json": {"session": [vocab_id], "k": "20"}},
        "k_zero": {"json": {"session": [vocab_id], "k": 0}},
        "id_float": {"json": {"session": [vocab_id, 1.5]}},
        "id_null": {"json": {"session": [None]}},
        "id_unreadable": {"json": {"session": ["not-an-id"]}},
        "empty_session": {"json": {"sessions": [[vocab_id], []]}},
        "unknown_id_error": {"json": {"session": [vocab_id, 987654321987], "on_unknown": "error"}},
        "items_10000": {"json": {"session": [vocab_id] * 10_000}},
        "unknown_field": {"json": {"session": [vocab_id], "kk": 5}},
        "body_over_limit": {"content": b'{"session": [' + b"1," * (over // 2) + b"1]}"},
        "body_over_limit_chunked": {"content": chunks(over)},
    }


async def send_bad(url: str, vocab_id: int, max_bytes: int) -> dict[str, dict]:
    out = {}
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        for name, kwargs in bad_requests(vocab_id, max_bytes).items():
            try:
                reply = await client.post("/recommend", **kwargs)
                message = reply.json().get("error", "") if reply.headers.get("content-type", "").startswith(
                    "application/json") else reply.text
                out[name] = {"status": reply.status_code, "error": message[:160]}
            except httpx.HTTPError as err:  # e.g. the server closed the connection mid-upload
                out[name] = {"status": None, "error": f"{type(err).__name__}: {err}"[:160]}
        unknown = await client.post("/recommend", json={"session": [vocab_id, 987654321987]})
        out["unknown_id_oov_default"] = {"status": unknown.status_code, "error": ""}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "runs/pipeline_rsc15/pipeline")
    parser.add_argument("--data", type=Path, default=DATA, help="click file the request sessions come from")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=500, help="requests per concurrency level (at most)")
    parser.add_argument("--seconds", type=float, default=30.0, help="time per concurrency level (at most)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    args = parser.parse_args()
    if not any((args.model_dir / name).exists() for name in ("pipeline.json", "config.json")):
        raise SystemExit(f"{args.model_dir}: no saved pipeline or model; run sessrec fit on a recipe first")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    ok = True
    try:
        health = wait_healthy(url, server)
        print(f"serving {health} on {url}", file=sys.stderr)
        n = args.warmup + args.requests
        sessions = request_sessions(args.data, n) if args.data.exists() else vocabulary_sessions(args.model_dir, n)
        asyncio.run(load_level(url, sessions[: args.warmup], 1, args.warmup, args.seconds, args.k))
        for concurrency in args.concurrency:
            before = httpx.get(f"{url}/metadata").json()["batching"]
            result = asyncio.run(load_level(url, sessions[args.warmup :], concurrency, args.requests, args.seconds,
                                            args.k))
            after = httpx.get(f"{url}/metadata").json()["batching"]
            calls = after["model_calls"] - before["model_calls"]
            scored = after["sessions"] - before["sessions"]
            ok &= result["errors"] == 0
            print(json.dumps({
                "system": "serve", "model": health["kind"], "items": health.get("items"), "threads": args.threads,
                "concurrency": concurrency, **result, "model_calls": calls,
                "mean_sessions_per_call": round(scored / calls, 2) if calls else None,
                "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
            }), flush=True)
        limits = httpx.get(f"{url}/metadata").json()["limits"]
        bad = asyncio.run(send_bad(url, sessions[0][0], limits["max_request_bytes"]))
        health_after = httpx.get(f"{url}/health").status_code
        alive = server.poll() is None
        refused = all(v["status"] is not None and 400 <= v["status"] < 500 for name, v in bad.items()
                      if name != "unknown_id_oov_default")
        ok &= refused and health_after == 200 and alive and bad["unknown_id_oov_default"]["status"] == 200
        print(json.dumps({"system": "serve-bad-requests", "statuses": {k: v["status"] for k, v in bad.items()},
                          "messages": {k: v["error"] for k, v in bad.items()}, "all_4xx": refused,
                          "health_after": health_after, "server_alive": alive}), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()

"""Load test of the HTTP server (`sessrec.serving.server`) on loopback: latency and requests/s, overload, bad requests.

Starts ``serve(--model-dir)`` in a subprocess on a free 127.0.0.1 port (`--workers` processes,
each with `--threads` torch threads), waits for ``/health``, and at each `--concurrency` level
keeps that many connections busy with one-session ``/recommend`` requests (closed loop), after
`--warmup` requests one at a time. The client costs little and runs in a process of its own
(`--client`): wrk (C, one thread, for `--seconds`) where installed, else this script's raw
HTTP/1.1 client on asyncio (uvloop) in a spawned process (until `--requests` are answered or
`--seconds` have passed). Each level reports requests/s, p50/p99 latency, the statuses, the CPU
per request of the server (its processes; split between the workers' event-loop threads, which
read, check and encode the requests, and their other threads, which run the model calls, decode
and write the answers) and of the client, the 1-minute load average before and after, the
sessions per model call (the dynamic batching) and the mean time of a call (from ``/metrics``:
summed over the workers). With `--model-batches`, it first times the served model in its own
process at those batch sizes, stage by stage (`model_batches`): what a call costs at the batch
sizes the server forms. Sessions are prefixes of random length of the sessions in `--data` (rsc15_100k's
test day; raw ids, as a request carries them; with `--times`, their event times too), or of
random vocabulary ids when the file is missing.

With `--overload`, it then measures what the server can do (`--capacity-clients` clients sending
requests of `--overload-sessions` sessions back to back for `--capacity-seconds`; by default
enough clients for 256 sessions in flight), and offers
`--overload-factor` times that many requests per second for `--overload-seconds`, at a steady
rate whatever the answers (open loop, through a raw HTTP/1.1 client so that the client costs
little CPU; at most `--max-connections` open at once, a request counted from the moment it was
due). A separate connection asks ``/health`` every `--health-interval-ms` meanwhile. It reports
the share of requests shed (503 and 504), p50/p99 latency of the accepted and of the shed
requests, ``/health`` latency (p50/p99/max) during the flood, and the server's RSS before and
after (and its peak). Requests still unanswered `--drain-seconds` after the flood are counted
as ``unanswered``.

Then it sends the malformed requests (broken JSON, wrong types, empty session, unknown id with
``on_unknown: "error"``, 10,000 items, bodies over the byte limit with and without
Content-Length) and checks that each gets a 4xx and that ``/health`` still answers. Exits 1 when
a load request failed, a bad request got anything but a 4xx, or the server went down.

One JSON line per concurrency level, one for the overload, then one for the bad requests. Client
and server share the machine's cores: the client's CPU per request says what it took from the
server. The server's settings are its defaults unless `--deadline-ms`, `--max-queue`,
`--max-queued-sessions` or `--workers` say otherwise (only the flags given are passed, so the
script also drives a server of an older sessrec on ``PYTHONPATH``).

Example (from the repository root):
    python benchmarks/serve_load.py                                     # runs/pipeline_rsc15/pipeline
    python benchmarks/serve_load.py --model-dir <dir> --concurrency 1 16 --seconds 15 --workers 2
    python benchmarks/serve_load.py --times --model-batches 1 4 8 16 32 --concurrency 16 --seconds 10 --workers 2
    python benchmarks/serve_load.py --model-dir runs/quickstart/model --data none --requests 2000 --overload
    python benchmarks/serve_load.py --quick --overload   # smoke run: a tiny co-visitation pipeline it builds itself

`--quick` serves a tiny co-visitation pipeline (synthetic sessions, 60 items) saved in a scratch folder
unless `--model-dir` is given, with sessions from its vocabulary, at concurrency 1 and 4, 20 requests
each (the Python client), the model timed at batch 1 and 4 (8 sessions each), and (with `--overload`) 1 s
of capacity and 2 s of flood of 8-session requests.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
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
    given = {name: getattr(args, name) for name in ("deadline_ms", "max_queue", "max_queued_sessions", "workers")
             if getattr(args, name) is not None}
    if args.workers is not None:
        given["threads"] = args.threads  # each worker's torch threads
    settings = "".join(f", {name}={value!r}" for name, value in given.items())
    code = (  # the guard: spawned workers import this as their main module, and must not serve themselves
        f"import torch; torch.set_num_threads({args.threads})\n"
        "from sessrec.serving.server import serve\n"
        "if __name__ == '__main__':\n"
        f"    serve({str(args.model_dir)!r}, port={port}, max_batch_size={args.max_batch_size}, "
        f"max_wait_ms={args.max_wait_ms}{settings}, log_level='warning', access_log=False)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def cpu_s(pid: int | None = None, thread: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process `pid` (by its thread `thread` when given), or
    by this one and its waited children."""
    if pid is None:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pids(server: subprocess.Popen) -> list[int]:
    """The server's process and its workers (Linux /proc)."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return [server.pid, *(int(pid) for pid in children if Path(f"/proc/{pid}").exists())]


def rss_mb(server: subprocess.Popen) -> dict[str, float]:
    """The server's resident memory now (VmRSS) and at its peak (VmHWM), summed over its processes, in MB."""
    kb = Counter()
    for pid in server_pids(server):
        status = Path(f"/proc/{pid}/status").read_text()
        for key in ("VmRSS", "VmHWM"):
            kb[key] += int(re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE).group(1))
    return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "peak_rss_mb": round(kb["VmHWM"] / 1024, 1)}


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


def request_sessions(data: Path, n: int, seed: int = 0) -> tuple[list[list[int]], list[list[float]]]:
    """`n` session prefixes (raw ids, oldest first) from a SessionId/ItemId/Time click file, and their event times."""
    table = pacsv.read_csv(data, parse_options=pacsv.ParseOptions(delimiter="\t")).to_pandas()
    table = table.sort_values(["SessionId", "Time"], kind="stable")
    groups = table.groupby("SessionId", sort=False)
    sessions, times = [g.tolist() for _, g in groups["ItemId"]], [g.tolist() for _, g in groups["Time"]]
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, len(sessions), n)
    lengths = [int(rng.integers(1, len(sessions[i]) + 1)) for i in picked]
    return [sessions[i][:n] for i, n in zip(picked, lengths)], [[float(t) for t in times[i][:n]] for i, n in zip(picked, lengths)]


def vocabulary_sessions(model_dir: Path, n: int, seed: int = 0) -> list[list[int]]:
    """`n` random sessions of 1-10 ids from the served pipeline's vocabulary (when there is no click file)."""
    from sessrec.data.vocab import ItemVocab

    raw = ItemVocab.load(model_dir / "vocab.parquet").raw_ids.slice(2).to_pylist()
    rng = np.random.default_rng(seed)
    return [[raw[i] for i in rng.integers(0, len(raw), int(rng.integers(1, 11)))] for _ in range(n)]


async def closed_loop(port: int, bodies: list[bytes], concurrency: int, requests: int, seconds: float) -> dict:
    """`concurrency` connections, each sending its next request as soon as the previous one is answered."""
    latencies: list[float] = []
    statuses: Counter = Counter()
    sent = 0
    deadline = time.perf_counter() + seconds
    pool = Pool(port, concurrency)

    async def worker() -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < deadline:
            raw = bodies[sent % len(bodies)]
            sent += 1
            t = time.perf_counter()
            try:
                status, body = await pool.send(raw)
            except (OSError, asyncio.IncompleteReadError) as err:
                statuses[type(err).__name__] += 1
                continue
            ok = status == 200 and body.startswith(b'{"recommendations":[{') and body.count(b'"item_ids"') == 1
            statuses[status if ok else f"bad-{status}"] += 1
            latencies.append((time.perf_counter() - t) * 1e3)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    pool.close()
    return {"latencies_ms": latencies, "statuses": {str(k): v for k, v in statuses.items()}, "wall_s": wall}


def python_client(port: int, bodies: list[bytes], concurrency: int, requests: int, seconds: float) -> dict:
    """`closed_loop` in this process (the client's own, under uvloop where installed), with its CPU seconds."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    gc.disable()  # its full collections would add their pauses to the latencies measured
    cpu = cpu_s()
    result = asyncio.run(closed_loop(port, bodies, concurrency, requests, seconds))
    return {**result, "client_cpu_s": cpu_s() - cpu}


def run_python_client(port: int, bodies: list[bytes], concurrency: int, requests: int, seconds: float) -> dict:
    """`python_client` in a process of its own: the client's CPU is counted apart from this script's."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        out = pool.submit(python_client, port, [post(b) for b in bodies], concurrency, requests, seconds).result()
    times = np.array(out["latencies_ms"])
    statuses = Counter(out["statuses"])
    return {
        "client": "python: raw HTTP/1.1 on asyncio (uvloop), a process of its own",
        "requests": int(sum(statuses.values())), "wall_s": round(out["wall_s"], 2),
        "requests_per_s": round(statuses["200"] / out["wall_s"], 1),
        "p50_ms": round(float(np.percentile(times, 50)), 2) if len(times) else None,
        "p99_ms": round(float(np.percentile(times, 99)), 2) if len(times) else None,
        "statuses": dict(sorted(statuses.items())), "client_cpu_s": round(out["client_cpu_s"], 2),
    }


WRK_SCRIPT = """
local bodies, i = {}, 0
for line in io.lines(os.getenv("SERVE_LOAD_BODIES")) do bodies[#bodies + 1] = line end
local headers = {["Content-Type"] = "application/json"}
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/recommend", headers, bodies[i])
end
"""


def wrk_ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def run_wrk(port: int, bodies: list[bytes], concurrency: int, seconds: float) -> dict:
    """wrk (C, one thread) keeping `concurrency` connections busy for `seconds`; its CPU from getrusage."""
    with tempfile.TemporaryDirectory(prefix="serve_load_wrk_") as folder:
        (Path(folder) / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
        (Path(folder) / "post.lua").write_text(WRK_SCRIPT)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency",
                               "-s", str(Path(folder) / "post.lua"), f"http://127.0.0.1:{port}"],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "SERVE_LOAD_BODIES": str(Path(folder) / "bodies.jsonl")})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = done.stdout
    count, wall = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out).groups()[:2]
    wall_s = float(wall) * (1e-3 if re.search(r"requests in [\d.]+ms", out) else 1.0)
    bad = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    percent = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.MULTILINE))
    version = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False).stdout.split(" [")[0].strip()
    statuses = {"200": int(count) - bad, **({"non-2xx": bad} if bad else {}), **({"socket-errors": errors} if errors else {})}
    return {
        "client": f"{version}: C, one thread", "requests": int(count), "wall_s": wall_s,
        "requests_per_s": round((int(count) - bad) / wall_s, 1),
        "p50_ms": round(wrk_ms(percent["50"]), 2), "p99_ms": round(wrk_ms(percent["99"]), 2), "statuses": statuses,
        "client_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
    }


def server_cpu_s(server: subprocess.Popen) -> float:
    """CPU seconds used so far by the server: its process and its workers."""
    return sum(cpu_s(pid) for pid in server_pids(server))


def loop_cpu_s(server: subprocess.Popen) -> float:
    """CPU seconds used so far by the main threads of the server's processes: each worker's event loop
    (HTTP, admission, each request's checks and encoding, batching); the rest of the server's CPU is
    its other threads' (the model calls with their decoding and JSON answers)."""
    return sum(cpu_s(pid, pid) for pid in server_pids(server))


def batch_counts(port: int) -> tuple[float, float, float]:
    """(model calls, sessions scored, seconds in model calls) so far, from /metrics (summed over the workers)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    found = {f"{name}_{part}": float(value) for name, part, value in re.findall(
        r"^sessrec_(batch_sessions|model_call_seconds)_(count|sum) (\S+)$", text, re.MULTILINE)}
    return found["batch_sessions_count"], found["batch_sessions_sum"], found["model_call_seconds_sum"]


def load_level(args: argparse.Namespace, port: int, server: subprocess.Popen, bodies: list[bytes],
               concurrency: int) -> dict:
    """One closed-loop level through the chosen client, with the server's and the client's CPU per request."""
    calls, scored, call_s = batch_counts(port)
    load = os.getloadavg()[0]
    cpu, loop = server_cpu_s(server), loop_cpu_s(server)
    if args.client == "wrk":
        result = run_wrk(port, bodies, concurrency, args.seconds)
    else:
        result = run_python_client(port, bodies, concurrency, args.requests, args.seconds)
    cpu, loop = server_cpu_s(server) - cpu, loop_cpu_s(server) - loop
    calls_after, scored_after, call_s_after = batch_counts(port)
    errors = sum(n for status, n in result["statuses"].items() if status != "200")
    n, made = result["requests"], calls_after - calls

    def per_request(seconds: float) -> int | None:
        return round(seconds / n * 1e6) if n else None

    return {
        **result, "errors": errors, "model_calls": int(made),
        "mean_sessions_per_call": round((scored_after - scored) / made, 2) if made else None,
        "mean_model_call_ms": round((call_s_after - call_s) / made * 1e3, 2) if made else None,
        "server_cpu_us_per_request": per_request(cpu), "server_loop_cpu_us_per_request": per_request(loop),
        "server_other_threads_cpu_us_per_request": per_request(cpu - loop),
        "client_cpu_us_per_request": per_request(result["client_cpu_s"]),
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
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


async def send_bad(url: str, vocab_id: int, max_bytes: int, times: bool = False) -> dict[str, dict]:
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
        unknown = await client.post("/recommend", json={"session": [vocab_id, 987654321987],
                                                         **({"times": [1.396e9, 1.396e9 + 60]} if times else {})})
        out["unknown_id_oov_default"] = {"status": unknown.status_code, "error": ""}
    return out


class Connection:
    """One keep-alive HTTP/1.1 connection: a request's bytes out, (status, body) back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.open, self.used = reader, writer, True, False

    @classmethod
    async def to(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        self.used = True
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        body = await self.reader.readexactly(int(length.group(1))) if length else b""
        if re.search(rb"(?i)\r\nconnection:\s*close", head):
            self.close()
        return status, body

    def close(self) -> None:
        self.open = False
        self.writer.close()


class Pool:
    """At most `size` connections to the server, reused; a request waits for a free one."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.idle, self.free = port, [], asyncio.Semaphore(size)

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        async with self.free:
            conn = self.idle.pop() if self.idle else await Connection.to(self.port)
            try:
                status, body = await conn.send(raw)
            except (asyncio.IncompleteReadError, ConnectionError):
                conn.close()
                if not conn.used:
                    raise
                conn = await Connection.to(self.port)  # the server closed an idle keep-alive connection
                status, body = await conn.send(raw)
            if conn.open:
                self.idle.append(conn)
            return status, body

    def close(self) -> None:
        for conn in self.idle:
            conn.close()


def post(body: bytes) -> bytes:
    return (b"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def percentiles(values: list[float]) -> dict[str, float | None]:
    times = np.array(values)
    if not len(times):
        return {"p50_ms": None, "p99_ms": None}
    return {"p50_ms": round(float(np.percentile(times, 50)), 2), "p99_ms": round(float(np.percentile(times, 99)), 2)}


HEALTH_PROBE = """
import json, socket, sys, time
port, interval, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection(("127.0.0.1", port))
raw, times, end = b"GET /health HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n", [], time.perf_counter() + seconds
while time.perf_counter() < end:
    start, reply = time.perf_counter(), b""
    sock.sendall(raw)
    while b"\\r\\n\\r\\n" not in reply or not reply.endswith(b"}"):  # the body is one JSON object
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit("the server closed the /health connection")
        reply += chunk
    times.append((time.perf_counter() - start) * 1e3)
    if not reply.startswith(b"HTTP/1.1 200"):
        sys.exit("/health answered " + reply.split(b"\\r\\n", 1)[0].decode())
    time.sleep(interval)
print(json.dumps(times))
"""


def start_health_probe(port: int, interval: float, seconds: float) -> subprocess.Popen:
    """A process of its own that asks /health every `interval` s for `seconds`: the flood's client
    shares neither its event loop nor its garbage collector, so its latencies are the server's."""
    return subprocess.Popen([sys.executable, "-c", HEALTH_PROBE, str(port), str(interval), str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def read_health_probe(probe: subprocess.Popen) -> list[float]:
    out, _ = probe.communicate(timeout=120)
    if probe.returncode != 0:
        raise SystemExit(f"the /health probe failed (exit {probe.returncode})")
    return json.loads(out)


async def capacity(port: int, bodies: list[bytes], clients: int, seconds: float) -> tuple[float, Counter]:
    """Requests answered 200 per second by `clients` closed-loop clients (the server's capacity), and
    the statuses of their answers."""
    pool, answered, sent = Pool(port, clients), Counter(), 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            sent += 1
            status, _ = await pool.send(bodies[sent % len(bodies)])
            answered[status] += 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    pool.close()
    if answered[200] == 0:
        raise SystemExit(f"no request answered 200 while measuring capacity: {dict(answered)}")
    return answered[200] / wall, answered


async def flood(port: int, bodies: list[bytes], rate: float, seconds: float, connections: int,
                health_interval: float, drain_seconds: float) -> dict:
    """`rate` requests per second for `seconds` (open loop), /health probed by another process meanwhile."""
    pool = Pool(port, connections)
    statuses: Counter = Counter()
    accepted: list[float] = []
    shed: list[float] = []

    async def one(raw: bytes, due: float) -> None:
        try:
            status, _ = await pool.send(raw)
        except (OSError, asyncio.IncompleteReadError) as err:
            statuses[type(err).__name__] += 1
            return
        took = (time.perf_counter() - due) * 1e3  # from when it was due: waiting for a connection counts
        statuses[status] += 1
        (accepted if status == 200 else shed if status in (503, 504) else []).append(took)

    prober = start_health_probe(port, health_interval, seconds)
    tasks, start, n = [], time.perf_counter(), int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(bodies[i % len(bodies)], due)))
    offered_s = time.perf_counter() - start
    _, pending = await asyncio.wait(tasks, timeout=drain_seconds) if tasks else (set(), set())
    wall_s = time.perf_counter() - start
    for task in pending:
        task.cancel()
    pool.close()
    health = read_health_probe(prober)
    answered = sum(statuses.values())
    refused = statuses[503] + statuses[504]
    return {
        "offered_requests": n, "offered_per_s": round(n / offered_s, 1), "wall_s": round(wall_s, 1),
        "answered_200_per_s": round(statuses[200] / wall_s, 1), "unanswered": len(pending),
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "shed_share": round(refused / n, 4) if n else None, "answered_200_share": round(statuses[200] / n, 4) if n else None,
        "accepted": percentiles(accepted), "shed": percentiles(shed),
        "health": {**percentiles(health), "max_ms": round(max(health), 2) if health else None, "probes": len(health)},
        "answered": answered,
    }


def shed_counts(port: int) -> dict[str, float] | None:
    """The server's counters of requests shed, by reason (None from a server without /metrics)."""
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics")
    if reply.status_code != 200:
        return None
    return {f"{name}{labels}": float(value) for name, labels, value in re.findall(
        r"^(sessrec_shed_total|sessrec_expired_in_queue_total|sessrec_model_call_seconds_sum)(\{[^}]*\})? (\S+)$",
        reply.text, re.MULTILINE)}


def overload(args: argparse.Namespace, port: int, server: subprocess.Popen, sessions: list[list[int]],
             times: list[list[float]] | None) -> dict:
    """Capacity first, then `--overload-factor` times it, open loop; see the module docstring."""
    size = args.overload_sessions
    rows = [[(i * size + j) % len(sessions) for j in range(size)] for i in range(200)]
    bodies = [post(json.dumps({"sessions": [sessions[r] for r in row], "k": args.k,
                               **({"times": [times[r] for r in row]} if args.times else {})}).encode()) for row in rows]
    clients = args.capacity_clients or max(2, 256 // size)
    rate, capacity_statuses = asyncio.run(capacity(port, bodies, clients, args.capacity_seconds))
    gc.collect()
    gc.freeze()  # the client's own full collections would delay the requests it sends
    before, shed_before, (calls, scored, _) = rss_mb(server), shed_counts(port), batch_counts(port)
    server_cpu, client_cpu = server_cpu_s(server), cpu_s()
    result = asyncio.run(flood(port, bodies, args.overload_factor * rate, args.overload_seconds, args.max_connections,
                               args.health_interval_ms / 1e3, args.drain_seconds))
    server_cpu, client_cpu = server_cpu_s(server) - server_cpu, cpu_s() - client_cpu
    after, (calls_after, scored_after, _) = rss_mb(server), batch_counts(port)
    meta = httpx.get(f"http://127.0.0.1:{port}/metadata").json()
    shed_after = shed_counts(port)
    return {
        "system": "serve-overload", "sessions_per_request": size, "capacity_requests_per_s": round(rate, 1),
        "capacity_clients": clients, "capacity_statuses": {str(k): v for k, v in sorted(capacity_statuses.items())},
        "capacity_sessions_per_s": round(rate * size, 1), "factor": args.overload_factor,
        "seconds": args.overload_seconds, **result, "rss_before_mb": before["rss_mb"], "rss_after_mb": after["rss_mb"],
        "peak_rss_mb": after["peak_rss_mb"], "server_cpu_s": round(server_cpu, 1), "client_cpu_s": round(client_cpu, 1),
        "server_overload_settings": meta.get("overload"),
        "server_shed_counts": None if shed_after is None else {
            name: value - shed_before.get(name, 0.0) for name, value in shed_after.items()},
        "mean_sessions_per_call": round((scored_after - scored) / (calls_after - calls), 2) if calls_after > calls else None,
    }


def model_batches(args: argparse.Namespace, bodies: list[bytes]) -> list[dict]:
    """The served recommender's CPU per call at each batch size of `--model-batches`, in this process
    (`--threads` torch threads), stage by stage as the server runs them: each request's checks and
    encoding (``parse_encode``, on the event loop), the join, the model call (a pipeline's stages:
    each retriever, merge and filters, features, each ranker member, the blend, ordering; else
    ``recommend_batch``), ``decode``, the JSON answers. Medians over calls of consecutive `bodies`
    (at least `--model-batch-sessions` sessions a size, 3 calls at least), after one call to warm up;
    the staged lists are checked against ``recommend_batch``'s once a size."""
    import torch

    from sessrec.pipeline.pipeline import Pipeline
    from sessrec.serving.batching import dumps
    from sessrec.serving.recommender import join_sessions, load_recommender
    from sessrec.serving.request import Limits, encode, parse_request

    torch.set_num_threads(args.threads)
    model, limits = load_recommender(args.model_dir), Limits()
    sys.path.insert(0, str(Path(__file__).parent))
    from pipeline_latency import recommend_in_stages

    def call(batch: list[bytes]) -> tuple[dict[str, float], object, object]:
        laps, mark = Counter(), [time.process_time()]

        def lap(name: str) -> None:
            now = time.process_time()
            laps[name] += (now - mark[0]) * 1e3
            mark[0] = now

        parts = [encode(parse_request(body, limits)[0], model) for body in batch]
        lap("parse_encode")
        sessions = join_sessions(parts)
        lap("join")
        if isinstance(model, Pipeline):
            recs = recommend_in_stages(model, sessions.to(model.device), args.k, lap)
        else:
            recs = model.recommend_batch(sessions, args.k)
            lap("model")
        lists = model.decode(recs)
        lap("decode")
        for i in range(len(lists)):
            dumps({"recommendations": lists[i : i + 1]})
        lap("answers")
        return laps, sessions, recs

    out = []
    with torch.no_grad():
        for size in args.model_batches:
            calls = max(3, -(-args.model_batch_sessions // size))
            batches = [[bodies[(i * size + j) % len(bodies)] for j in range(size)] for i in range(calls + 1)]
            _, sessions, recs = call(batches[0])
            if not torch.equal(recs.items, model.recommend_batch(sessions, args.k).items):
                raise SystemExit(f"--model-batches: the staged lists differ from recommend_batch's at batch {size}")
            timed = [call(batch)[0] for batch in batches[1:]]
            totals = [sum(laps.values()) for laps in timed]
            per_call = float(np.median(totals))
            out.append({
                "system": "serve-model-batch", "model": type(model).__name__, "threads": args.threads, "batch": size,
                "calls": calls, "cpu_ms_per_call": round(per_call, 3), "cpu_ms_per_session": round(per_call / size, 3),
                "stages_cpu_ms_per_call": {name: round(float(np.median([laps[name] for laps in timed])), 3)
                                           for name in timed[0]},
            })
    return out


def tiny_pipeline(directory: Path) -> Path:
    """A co-visitation pipeline over 60 synthetic items saved in `directory` (what `--quick` serves)."""
    from sessrec.data import SyntheticSource
    from sessrec.pipeline.pipeline import Pipeline
    from sessrec.pipeline.retrieval.covisitation import CoVisitation
    from sessrec.tasks import SessionDataModule

    data = SessionDataModule(source=SyntheticSource(num_sessions=400, num_items=60, days=10), max_length=10)
    train, _ = data.tensors("train")
    pipe = Pipeline(data.vocab, {"covisitation": (CoVisitation().fit(train, data.num_items), 20)}, max_length=10,
                    max_candidates=20)
    return Path(pipe.save_pretrained(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="saved pipeline or model (default: runs/pipeline_rsc15/pipeline)")
    parser.add_argument("--data", type=Path, help="click file the request sessions come from (default: rsc15_100k's test "
                        "day; a missing file: random sessions of the model's vocabulary)")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--requests", type=int, default=500, help="requests per concurrency level (at most)")
    parser.add_argument("--seconds", type=float, default=30.0, help="time per concurrency level (at most)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--times", action="store_true",
                        help="send each session's event times (a ranker fitted with time features needs them)")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (each worker's)")
    parser.add_argument("--workers", type=int, help="the server's worker processes (its default, 1, when not given)")
    parser.add_argument("--client", choices=["wrk", "python"], default="wrk" if shutil.which("wrk") else "python",
                        help="the closed-loop client: wrk (C, one thread; the default where installed, for "
                        "--seconds) or this script's raw HTTP/1.1 client in a process of its own (for --requests "
                        "or --seconds)")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--deadline-ms", type=float, help="the server's deadline (its default when not given)")
    parser.add_argument("--max-queue", type=int, help="the server's bound on admitted requests")
    parser.add_argument("--max-queued-sessions", type=int, help="the server's bound on sessions waiting")
    parser.add_argument("--model-batches", type=int, nargs="*", default=[],
                        help="first time the served model in this process at these batch sizes, stage by stage "
                        "(e.g. 1 4 8 16 32: the sessions per call the server forms; `model_batches`)")
    parser.add_argument("--model-batch-sessions", type=int, default=512,
                        help="sessions timed at each --model-batches size (at least 3 calls)")
    parser.add_argument("--overload", action="store_true", help="measure capacity, then offer more (see above)")
    parser.add_argument("--overload-factor", type=float, default=4.0, help="offered load / measured capacity")
    parser.add_argument("--overload-seconds", type=float, default=30.0)
    parser.add_argument("--overload-sessions", type=int, default=32, help="sessions per request in the overload")
    parser.add_argument("--capacity-clients", type=int,
                        help="closed-loop clients that measure capacity (default: 256 sessions in flight, at least 2)")
    parser.add_argument("--capacity-seconds", type=float, default=10.0)
    parser.add_argument("--max-connections", type=int, default=512, help="client connections open at once")
    parser.add_argument("--health-interval-ms", type=float, default=20.0)
    parser.add_argument("--drain-seconds", type=float, default=60.0, help="wait for answers after the flood")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a tiny pipeline built here (unless --model-dir), concurrency 1 and 4, 20 requests")
    args = parser.parse_args()
    scratch = None
    if args.quick:
        args.concurrency, args.requests, args.warmup, args.seconds = [1, 4], 20, 2, 20.0
        args.model_batches, args.model_batch_sessions = [1, 4], 8
        args.client = "python"  # 20 requests a level (wrk runs for a time)
        args.capacity_seconds, args.overload_seconds, args.overload_sessions = 1.0, 2.0, 8
        if args.model_dir is None:  # its own tiny pipeline, asked for sessions of its vocabulary
            scratch = tempfile.TemporaryDirectory(prefix="serve_load_")
            args.model_dir = tiny_pipeline(Path(scratch.name) / "pipeline")
            args.data = args.data or Path(scratch.name) / "none"
    args.model_dir = args.model_dir or ROOT / "runs/pipeline_rsc15/pipeline"
    args.data = args.data or DATA
    if not any((args.model_dir / name).exists() for name in ("pipeline.json", "config.json")):
        raise SystemExit(f"{args.model_dir}: no saved pipeline or model; run sessrec fit on a recipe first")

    n = args.warmup + args.requests
    if args.data.exists():
        sessions, times = request_sessions(args.data, n)
    else:
        sessions, times = vocabulary_sessions(args.model_dir, n), None
    if args.times and times is None:
        raise SystemExit(f"--times needs the click file --data ({args.data} is missing)")
    bodies = [json.dumps({"session": session, "k": args.k, **({"times": t} if args.times else {})}).encode()
              for session, t in zip(sessions, times or sessions)]
    for record in model_batches(args, bodies) if args.model_batches else []:  # before the server: alone
        print(json.dumps(record), flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    ok = True
    try:
        health = wait_healthy(url, server)
        print(f"serving {health} on {url}", file=sys.stderr)
        run_python_client(port, bodies[: args.warmup], 1, args.warmup, args.seconds)
        for concurrency in args.concurrency:
            result = load_level(args, port, server, bodies[args.warmup :], concurrency)
            ok &= result["errors"] == 0
            print(json.dumps({
                "system": "serve", "model": health["kind"], "items": health.get("items"), "threads": args.threads,
                "workers": args.workers or 1, "concurrency": concurrency, **result,
                "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
            }), flush=True)
        if args.overload:
            result = overload(args, port, server, sessions, times)
            ok &= result["unanswered"] == 0 and result["answered"] == result["offered_requests"]
            print(json.dumps(result), flush=True)
        limits = httpx.get(f"{url}/metadata").json()["limits"]
        bad = asyncio.run(send_bad(url, sessions[0][0], limits["max_request_bytes"], args.times))
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
        if scratch is not None:
            scratch.cleanup()
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()

"""HTTP load on the app under gunicorn, and the two creates measured against each other:
shared by bench/api.py (beside the bare insert and the reads) and bench/executors.py
(its `batch` arm, beside the executors and Procrastinate's batch defer).

- `load`: client threads on plain sockets, closed or open loop (its docstring says why
  not `requests`);
- `create_spec` / `batch_spec`: `POST /api/v1/jobs` with a new idempotency key each
  request, and `POST /api/v1/jobs/batch` of `size` jobs with a new key each (keys on);
- `closed_loop`: a 1 s warm-up, then `load` with the CPU each process spent per request;
- `per_job`: a batch's figures per job (jobs/s, CPU ms per job).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench import _common as common

# What bench/api.py and the executors' batch arm run by default: gunicorn workers, client
# threads of the single create, jobs per batch request (JOBOPS_BATCH_CREATE_MAX) and
# client threads of the batch create.
WEB_WORKERS, CLIENTS, BATCH_SIZE, BATCH_CLIENTS = 4, 16, 1000, 4
# The job every create submits: a type whose queue no benchmark's worker consumes, so
# the created jobs stay `queued` (published, never run).
SIM: dict[str, Any] = {"type": "sim", "params": {"steps": 3}}
WARMUP_SECONDS = 1.0


def load(
    *,
    url: str,
    method: str,
    headers: dict[str, str],
    concurrency: int,
    seconds: float,
    expect: int,
    body: Callable[[], Any] | None = None,
    rate: float | None = None,
) -> dict[str, Any]:
    """`concurrency` threads, each sending one request at a time, for `seconds`.

    Without `rate` each thread sends its next request as soon as the last one is
    answered (closed loop: the server's capacity). With `rate` the requests are due
    at fixed times, `rate` per second, taken by whichever thread is free (open loop),
    and a latency counts from the request's due time: a server that falls behind
    shows its queue in the figures, not fewer requests.

    The client writes each request as prepared bytes on a plain socket and reads the
    answer to its end (gunicorn's sync workers close the connection after each one):
    a few dozen microseconds of CPU per request. The `requests` library cost 0.6-0.8
    CPU ms per request, 40 % of these two cores, so the client was the bottleneck and
    every ratio was pulled towards 1. `client_cpu_ms_per_req` keeps that cost visible.
    """
    target = urlsplit(url)
    address = (target.hostname or "127.0.0.1", target.port or 80)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {target.netloc}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    ).encode("latin-1")

    def request_bytes() -> bytes:
        if body is None:
            return head + b"\r\n"
        content = json.dumps(body()).encode()
        return (
            head
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(content)).encode()
            + b"\r\n\r\n"
            + content
        )

    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    slots = itertools.count()

    def due() -> float:
        """When this thread's next request is due: now (closed loop) or its slot."""
        if rate is None:
            return time.perf_counter()
        with lock:
            at = stop_at[0] - seconds + next(slots) / rate
        time.sleep(max(0.0, at - time.perf_counter()))
        return at

    def client() -> None:
        mine: list[float] = []
        counts: Counter[int] = Counter()
        barrier.wait()
        while (began := due()) < stop_at[0]:
            data = request_bytes()
            counts[_exchange(address, data)] += 1
            mine.append((time.perf_counter() - began) * 1000)
        with lock:
            latencies.extend(mine)
            statuses.update(counts)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + seconds
    began = time.perf_counter()
    cpu_began = time.process_time()
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    client_cpu = time.process_time() - cpu_began
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "req_per_s": common.rate(len(latencies), elapsed),
        "client_cpu_ms_per_req": round(client_cpu * 1000 / max(len(latencies), 1), 3),
        **common.latency_summary(latencies),
        "statuses": {str(k): v for k, v in statuses.items()},
        "unexpected": sum(n for code, n in statuses.items() if code != expect),
    }


def _exchange(address: tuple[str, int], data: bytes) -> int:
    """Send one request on a new connection, read the answer to the end; its status
    (0: the connection failed or the answer was not HTTP)."""
    try:
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(data)
            answer = bytearray()
            while chunk := sock.recv(65536):
                answer += chunk
                if _complete(answer):
                    break
    except OSError:
        return 0
    status = bytes(answer[9:12])
    return int(status) if answer.startswith(b"HTTP/1.") and status.isdigit() else 0


def _complete(answer: bytearray) -> bool:
    """Whether `answer` holds the whole response: its head and Content-Length bytes (a
    response without Content-Length ends when the server closes)."""
    end = answer.find(b"\r\n\r\n")
    if end < 0:
        return False
    for line in bytes(answer[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(answer) - end - 4 >= int(value)
    return False


def new_job() -> dict[str, Any]:
    """The body of one create, with a new idempotency key."""
    return {**SIM, "idempotency_key": uuid.uuid4().hex}


def create_spec(base: str) -> dict[str, Any]:
    """`load`'s arguments for `POST /api/v1/jobs`, a new key each request (201)."""
    return {"url": f"{base}/api/v1/jobs", "method": "POST", "body": new_job, "expect": 201}


def batch_spec(base: str, *, size: int, concurrency: int) -> dict[str, Any]:
    """`load`'s arguments for `POST /api/v1/jobs/batch` of `size` jobs, a new key each
    (200), from `concurrency` client threads."""
    return {
        "url": f"{base}/api/v1/jobs/batch",
        "method": "POST",
        "body": lambda: {"jobs": [new_job() for _ in range(size)]},
        "expect": 200,
        "concurrency": concurrency,
    }


def closed_loop(cpu: common.CpuSampler, spec: dict[str, Any], *, seconds: float) -> dict[str, Any]:
    """`load(**spec)` for `seconds` after a warm-up (every gunicorn worker has its
    connections), with `cpu_ms_per_req` by process over the measured window and the
    warm-up's answers in `warmup_statuses` (what it created counts too)."""
    warmup = load(**{**spec, "seconds": WARMUP_SECONDS})
    began = time.time()
    figure = load(**{**spec, "seconds": seconds})
    figure["cpu_ms_per_req"] = cpu.ms_per_item(began, time.time(), figure["requests"])
    figure["warmup_statuses"] = warmup["statuses"]
    return figure


def per_job(figure: dict[str, Any], size: int) -> dict[str, Any]:
    """A batch's `closed_loop` figure with `jobs_per_s` and `cpu_ms_per_job` (each
    request creates `size` jobs when it answers 200)."""
    figure["jobs_per_s"] = round(figure["req_per_s"] * size, 1)
    figure["cpu_ms_per_job"] = {
        role: round(ms / size, 4) for role, ms in figure["cpu_ms_per_req"].items()
    }
    return figure

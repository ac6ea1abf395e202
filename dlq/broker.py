"""Broker-side dead-letter helpers (docs/architecture.md): depths, peek, drain, decode.

The database (`dead_letters`) is authoritative; the classic `<q>_dlq` queues hold the
broker's copies. Nothing here writes to the database: `dlq.services` decides what a
message means, this module only moves messages.

Caveats that hold for every function here:
- A classic DLQ has no dead-letter exchange of its own: never `reject(requeue=False)` on
  it (the message would be dropped). Messages leave a DLQ only by `ack`.
- Peek and drain take messages with `basic_get` and *hold* them unacked; messages held
  by one caller are invisible to every other caller (a concurrent peek sees fewer
  messages, never duplicates). They go back with `reject(requeue=True)`, in the order
  taken; RabbitMQ puts a requeued message back at its original position where it can,
  but a message published meanwhile or requeued by another client may interleave.
- Held messages count against RabbitMQ's `consumer_timeout` (30 min): a pass is bounded
  by `max_messages` and is meant to take seconds.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import ConnectionError as AmqpConnectionError
from amqp.exceptions import NotFound
from django.conf import settings
from kombu import Connection
from kombu.exceptions import OperationalError as KombuOperationalError

from core.broker import broker_channel, queue_depths
from core.json import json_loads, json_problem
from dlq.errors import UnknownQueueError
from jobs.domain.types import primary_queue_names
from jobs.integrations import metrics
from jobs.integrations.topology import dlq_name, dlq_names, is_dlq

# What a caller sees when RabbitMQ cannot be reached (refused, timed out, closed).
BROKER_ERRORS = (OSError, KombuOperationalError, AmqpConnectionError)

# x-death reasons (RabbitMQ) -> dead_letters.reason
BROKER_REASONS = {
    "rejected": "rejected",
    "expired": "expired",
    "maxlen": "maxlen",
    "delivery_limit": "delivery_limit",
}


@dataclass
class DecodedMessage:
    """What a dead-lettered Celery (protocol 2) message says, as far as it can be read.

    `payload` is the task's first argument, the wire payload of docs/architecture.md#publishing:
    `{job_id, type, params, submitted_by, attempt, created_at, request_id, correlation_id}`.
    """

    message_id: str
    job_id: str | None = None
    task: str | None = None
    task_id: str | None = None
    attempt: int | None = None
    payload: dict[str, Any] | None = None
    routing_key: str | None = None  # the original routing key (= the primary queue)
    queue: str | None = None  # the primary queue it died in
    reason: str | None = None  # dead_letters.reason from x-death
    x_death: list[dict[str, Any]] | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    body_text: str = ""
    decode_error: str | None = None
    delivery_tag: Any = None
    redelivered: bool = False

    @property
    def dlq(self) -> str | None:
        return dlq_name(self.queue) if self.queue else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-safe view for the portal, the API and `manage.py dlq peek`."""
        return {
            "message_id": self.message_id,
            "job_id": self.job_id,
            "task": self.task,
            "attempt": self.attempt,
            "routing_key": self.routing_key,
            "queue": self.queue,
            "reason": self.reason,
            "x_death": self.x_death,
            "headers": self.headers,
            "payload": self.payload,
            "body": None if self.payload is not None else self.body_text,
            "decode_error": self.decode_error,
            "redelivered": self.redelivered,
        }


# A dead-lettered message may hold anything (a hostile publisher, a bug): what is kept
# of it must fit the dead_letters columns and what PostgreSQL text/jsonb accept.
MAX_BODY_CHARS = 64 * 1024
MAX_HEADER_CHARS = 4096
MAX_HEADER_DEPTH = 16
MAX_MESSAGE_ID = 255


def clean_text(text: str, limit: int) -> str:
    """`text` storable in PostgreSQL: NUL and lone surrogates escaped, then truncated."""
    if len(text) <= limit and text.isascii() and "\x00" not in text:
        return text  # the common case, unchanged (ASCII holds no surrogate)
    text = text.replace("\x00", "\\u0000")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "...(truncated)"


def jsonable(value: Any, depth: int = 0) -> Any:
    """AMQP header values (datetimes, bytes, nested tables) as JSON-safe, storable values."""
    if depth > MAX_HEADER_DEPTH:
        return "(nested too deep)"
    if isinstance(value, str):
        return clean_text(value, MAX_HEADER_CHARS)
    if isinstance(value, dict):
        return {
            clean_text(str(k), MAX_HEADER_CHARS): jsonable(v, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return clean_text(raw.decode("utf-8"), MAX_HEADER_CHARS)
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw[:MAX_HEADER_CHARS]).decode("ascii")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _body_bytes(body: Any) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body or b"")


def _payload_from_body(body: bytes, content_type: str | None) -> tuple[Any, str | None]:
    """(task arguments, error) from a Celery body: protocol 2 `[args, kwargs, embed]`."""
    # The content type is only a hint: a job payload in a mislabelled message still
    # names its job, which is worth more to the operator than a raw body.
    try:
        decoded = json_loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"body is not JSON ({content_type or 'no content type'}): {exc!r}"[:500]
    problem = json_problem(decoded, max_depth=settings.JOBOPS_MAX_JSON_DEPTH + 4)
    if problem:
        return None, f"body {problem}"
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], list):
        args = decoded[0]
    elif isinstance(decoded, dict) and isinstance(decoded.get("args"), list):  # protocol 1
        args = decoded["args"]
    else:
        return None, "body is not a Celery message ([args, kwargs, embed])"
    if not args or not isinstance(args[0], dict):
        return None, "the task's first argument is not a job payload"
    return args[0], None


def decode_message(
    *,
    body: Any,
    headers: dict[str, Any] | None,
    properties: dict[str, Any] | None = None,
    delivery_info: dict[str, Any] | None = None,
) -> DecodedMessage:
    """Read a dead-lettered message without trusting it; never raises.

    1. Headers first: Celery's `id`/`task`, our `job_id` header, RabbitMQ's `x-death`
       (the entry of the primary queue gives the reason and the original routing key).
    2. Then the body: the job payload is the task's first argument; its `job_id` wins
       over a header only when the header is missing.
    3. The message identity is the Celery task id (unique per publish), else the AMQP
       message id, else a digest of the body and the first death.
    """
    headers = dict(headers or {})
    properties = dict(properties or {})
    raw = _body_bytes(body)
    safe_headers = jsonable(headers)
    x_death = safe_headers.get("x-death") if isinstance(safe_headers.get("x-death"), list) else None
    msg = DecodedMessage(message_id="", headers=safe_headers, x_death=x_death)
    msg.delivery_tag = (delivery_info or {}).get("delivery_tag")
    msg.redelivered = bool((delivery_info or {}).get("redelivered"))
    try:
        msg.body_text = clean_text(raw.decode("utf-8"), MAX_BODY_CHARS)
    except UnicodeDecodeError:
        msg.body_text = "base64:" + base64.b64encode(raw[:MAX_BODY_CHARS]).decode("ascii")
    # The death in the primary queue: the first entry naming a jobs queue, else the last.
    primaries = set(primary_queue_names())
    death = None
    for entry in x_death or []:
        if isinstance(entry, dict) and entry.get("queue") in primaries:
            death = entry
            break
    if death is None and x_death:
        death = x_death[-1] if isinstance(x_death[-1], dict) else None
    first_reason = safe_headers.get("x-first-death-reason")
    reason = (death or {}).get("reason") or first_reason
    msg.reason = BROKER_REASONS.get(str(reason)) if reason else None
    queue = (death or {}).get("queue") or safe_headers.get("x-first-death-queue")
    keys = (death or {}).get("routing-keys") or []
    routing_key = keys[0] if keys else (delivery_info or {}).get("routing_key")
    msg.routing_key = clean_text(str(routing_key), 255) if routing_key else None
    # Only our queues name a DLQ; anything else a header claims is not trusted.
    msg.queue = queue if queue in primaries else None
    if msg.queue is None and msg.routing_key in primaries:
        msg.queue = msg.routing_key
    msg.task = safe_headers.get("task") if isinstance(safe_headers.get("task"), str) else None
    _read_identity(
        msg,
        task_id=safe_headers.get("id"),
        header_job=safe_headers.get("job_id"),
        raw=raw,
        properties=properties,
    )
    if not msg.message_id:
        first_time = (death or {}).get("time") or ""
        digest = hashlib.sha256(raw + f"|{msg.queue}|{first_time}".encode()).hexdigest()
        msg.message_id = f"sha256:{digest}"
    _bound_message_id(msg)
    return msg


def _read_identity(
    msg: DecodedMessage, *, task_id: Any, header_job: Any, raw: bytes, properties: dict[str, Any]
) -> None:
    """The task id, the payload and its attempt, the job id (the header's, else the
    payload's), and the message id when the task id or the AMQP message id gives one
    ("" otherwise: the caller digests the message)."""
    msg.task_id = task_id if isinstance(task_id, str) and task_id else None
    payload, error = _payload_from_body(raw, properties.get("content_type"))
    if payload is not None:
        msg.payload = payload
        if isinstance(payload.get("attempt"), int):
            msg.attempt = payload["attempt"]
    msg.decode_error = error
    job_id = header_job or (payload or {}).get("job_id")
    msg.job_id = clean_text(str(job_id), 64) if job_id else None
    if msg.task_id:
        msg.message_id = f"task:{msg.task_id}"
    elif properties.get("message_id"):
        msg.message_id = f"amqp:{clean_text(str(properties['message_id']), MAX_MESSAGE_ID)}"


def _bound_message_id(msg: DecodedMessage) -> None:
    if len(msg.message_id) > MAX_MESSAGE_ID:  # still unique: a digest of the long id
        msg.message_id = "sha256:" + hashlib.sha256(msg.message_id.encode()).hexdigest()


def _amqp_parts(message: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(body, headers, the properties decode_message reads) of a kombu/py-amqp message."""
    props = getattr(message, "properties", None) or {}
    headers = getattr(message, "headers", None)
    if headers is None:
        headers = props.get("application_headers") or {}
    properties = {
        "content_type": getattr(message, "content_type", None) or props.get("content_type"),
        "message_id": props.get("message_id"),
    }
    return message.body, headers, properties


def decode_amqp(message: Any) -> DecodedMessage:
    """decode_message for a kombu/py-amqp message object."""
    body, headers, properties = _amqp_parts(message)
    return decode_message(
        body=body,
        headers=headers,
        properties=properties,
        delivery_info=getattr(message, "delivery_info", None),
    )


def decode_identity(message: Any) -> DecodedMessage:
    """What a drain decides by, read exactly as `decode_amqp` reads it: the message id,
    the job id and the attempt.

    Only the two headers that name them are made safe, not every header (x-death, the
    Celery fields) and the body, which only a message being recorded needs: that was
    most of a drain's time per message. A message named by neither a task id nor an
    AMQP message id gets the full decode (its id digests the body and its first death).
    """
    body, headers, properties = _amqp_parts(message)
    if not isinstance(headers, dict):
        return decode_amqp(message)
    msg = DecodedMessage(message_id="")
    _read_identity(
        msg,
        task_id=jsonable(headers.get("id")),
        header_job=jsonable(headers.get("job_id")),
        raw=_body_bytes(body),
        properties=properties,
    )
    if not msg.message_id:
        return decode_amqp(message)
    _bound_message_id(msg)
    return msg


# --- connections and queues ---------------------------------------------------------


def queue_depth(channel: Any, name: str) -> int:
    """Messages ready in `name` (passive declare; unacked messages are not counted)."""
    _, count, _ = channel.queue_declare(queue=name, passive=True)
    return int(count)


def dlq_depths(
    *, queues: Iterable[str] | None = None, connection: Connection | None = None
) -> dict[str, int | None]:
    """Depth of each DLQ (and of `dlq.watch` if asked), None where the queue is missing.

    Raises the broker's connection error when RabbitMQ cannot be reached; callers that
    must not fail (the portal overview) catch it and show "unknown".
    """
    names = list(queues) if queues is not None else dlq_names()
    depths = queue_depths(names, connection=connection)
    _export_depths(depths)
    return depths


def _export_depths(depths: dict[str, int | None]) -> None:
    """Feed the `dlq_depth{queue}` gauge whenever depths are read."""
    for name, depth in depths.items():
        if depth is not None:
            metrics.DLQ_DEPTH.labels(queue=name).set(depth)


def _require_dlq(queue: str) -> None:
    # Only the classic DLQs: a get-and-requeue on a primary quorum queue would count as
    # a delivery there and could push a job's message over its delivery limit.
    if not is_dlq(queue):
        raise UnknownQueueError(
            f"{queue!r} is not a dead-letter queue.",
            details={"queue": [f"One of: {', '.join(dlq_names())}."]},
        )


def _get_all(channel: Any, queue: str, limit: int) -> list[Any]:
    """Take up to `limit` messages with basic_get, unacked (held by this channel)."""
    taken: list[Any] = []
    while len(taken) < limit:
        message = channel.basic_get(queue=queue, no_ack=False)
        if message is None:
            break
        taken.append(message)
    return taken


def _requeue(channel: Any, messages: Iterable[Any]) -> None:
    for message in messages:
        channel.basic_reject(message.delivery_tag, requeue=True)


def dlq_peek(
    *, queue: str, limit: int = 20, connection: Connection | None = None
) -> list[DecodedMessage]:
    """Up to `limit` messages of a DLQ, decoded, WITHOUT consuming them.

    basic_get without ack, then every message goes back with reject(requeue=True), in
    the order taken (see the module caveats on ordering and concurrent callers).
    """
    _require_dlq(queue)
    with broker_channel(connection) as channel:
        try:
            taken = _get_all(channel, queue, max(0, int(limit)))
        except NotFound:
            # Not declared in this vhost yet (setup_topology not run): nothing was
            # dead-lettered there, as dlq_drain reads it too.
            return []
        try:
            return [decode_amqp(m) for m in taken]
        finally:
            _requeue(channel, taken)


@dataclass
class DrainResult:
    seen: int = 0
    acked: int = 0
    kept: int = 0
    acked_message_ids: list[str] = field(default_factory=list)


# A pass's deliveries in flight at once (AMQP's prefetch count is 16 bits), and how long
# a pass waits for the next one before it ends with what it has seen (another client
# may hold the rest).
DRAIN_PREFETCH_MAX = 65_535
DRAIN_IDLE_SECONDS = 1.0


def dlq_drain(
    *,
    queue: str,
    decide: Callable[[list[DecodedMessage]], set[str]],
    batch_size: int = 500,
    max_messages: int = 100_000,
    connection: Connection | None = None,
) -> DrainResult:
    """One pass over a DLQ: ack the messages `decide` names, put every other one back.

    1. Read the depth once; take at most that many (bounded by `max_messages`), so the
       pass ends even while new dead letters arrive.
    2. Consume them with a prefetch window (the broker streams them: no round trip per
       message, as a basic_get each would cost); every `batch_size` messages ask
       `decide(batch)` (each message read by `decode_identity`: its message id, job
       id and attempt) for the message ids to drop (one database round trip per batch)
       and ack those at once.
    3. Hold the rest unacked until the end, then requeue them all, with any delivered
       past the budget: requeuing during the pass would hand them straight back to it.
       A pass that holds a full window, or waits DRAIN_IDLE_SECONDS for a message that
       does not come, ends with what it has seen; the next pass takes the rest.
    A replay of 10k jobs therefore costs one pass over the DLQ, not 10k scans.
    """
    _require_dlq(queue)
    result = DrainResult()
    with broker_channel(connection) as channel:
        try:
            depth = queue_depth(channel, queue)
        except NotFound:
            return result
        budget = min(depth, max_messages)
        if budget <= 0:
            return result
        held: list[Any] = []
        delivered: list[Any] = []
        window = min(budget, DRAIN_PREFETCH_MAX)
        channel.basic_qos(0, window, False)
        consumer = channel.basic_consume(queue, callback=delivered.append, no_ack=False)
        try:
            while result.seen < budget:
                batch = _next_batch(channel, delivered, min(batch_size, budget - result.seen))
                if not batch:
                    break
                result.seen += len(batch)
                decoded = [decode_identity(m) for m in batch]
                drop = decide(decoded)
                for message, info in zip(batch, decoded, strict=True):
                    if info.message_id in drop:
                        channel.basic_ack(message.delivery_tag)
                        result.acked += 1
                        result.acked_message_ids.append(info.message_id)
                    else:
                        held.append(message)
                if len(held) >= window:
                    break  # the window is full of kept messages: nothing more can come
            channel.basic_cancel(consumer)
        finally:
            _requeue(channel, [*held, *delivered])
        result.kept = len(held)
    return result


def _next_batch(channel: Any, delivered: list[Any], size: int) -> list[Any]:
    """Up to `size` messages from the consumer's deliveries, waiting for more while they
    keep coming; removed from `delivered`."""
    while len(delivered) < size:
        try:
            channel.connection.drain_events(timeout=DRAIN_IDLE_SECONDS)
        except TimeoutError:
            break
    batch = delivered[:size]
    del delivered[:size]
    return batch

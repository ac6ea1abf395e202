"""Connections to RabbitMQ (kombu), made in one place for every part of jobops.

Two kinds:

- `broker_connection(confirm=..., timeout=...)`: this thread's connection, reused across
  calls and rebuilt after an error (`broker_connection_drop`). Opening an AMQP connection
  costs several round trips and RabbitMQ advises against churn, so the publisher, the
  event relay, the DLQ tools and the queue-depth reader share one per thread. Keyed by
  URL, confirm mode and timeout: a test (or a reconfigured process) pointing BROKER_URL
  elsewhere gets a connection to the new place, and a request's short connect timeout is
  never a dispatcher's long one.
- `broker_connect(...)`: a new connection the caller owns and closes, for a long-lived
  consumer (the ERP bridge).

`confirm=True` turns on kombu's `confirm_publish`: every publish on it waits for the
broker's ack (one round trip per message). Batch publishers (the event relay) leave it
off and select confirms on their own channel to wait once per batch.

With JOBOPS_BROKER off (docs/smallest-deployment.md) both raise `BrokerOffError`
before touching the network: a connection error (an OSError), so every caller that
copes with RabbitMQ being down (the DLQ pages, the depth reader) copes with it being
off, and a caller that should not have been reached fails loudly.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from kombu import Connection, Queue

_local = threading.local()


class BrokerOffError(ConnectionError):
    """JOBOPS_BROKER is off: this deployment has no RabbitMQ to connect to."""

    def __init__(self) -> None:
        super().__init__("JOBOPS_BROKER is off: this deployment runs without RabbitMQ")


def broker_connect(*, confirm: bool = False, timeout: float | None = None) -> Connection:
    """A new, not yet connected, connection to BROKER_URL that the caller owns.

    BROKER_URL may list the nodes of a cluster separated by `;`: kombu then tries them
    in turn (round robin) when a connection cannot be made or is lost."""
    if not settings.JOBOPS_BROKER:
        raise BrokerOffError()
    options = {"confirm_publish": True} if confirm else {}
    return Connection(
        settings.BROKER_URL,
        connect_timeout=timeout or settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS,
        transport_options=options,
    )


def broker_connect_now(conn: Connection) -> Connection:
    """Connect `conn` with one quick try per node of BROKER_URL (no sleeping between
    tries), within one connect timeout per node. Raises the broker's connection error
    when no node answers."""
    nodes = max(1, len(conn.alt))
    conn.ensure_connection(
        max_retries=nodes,
        interval_start=0,
        interval_step=0,
        timeout=(conn.connect_timeout or 5) * nodes,
    )
    return conn


def broker_node(conn: Connection | None) -> str | None:
    """The node (host:port) `conn` is connected to now, or None: which node of a
    cluster a process talks to (/readyz, liveness)."""
    if conn is None or not conn.connected:
        return None
    return str(conn.host)


def thread_broker_node() -> str | None:
    """The node this thread's shared connection (`broker_connection`) is on, if any."""
    cache: dict[tuple[Any, ...], Connection] = _local.__dict__.setdefault("connections", {})
    for conn in cache.values():
        node = broker_node(conn)
        if node is not None:
            return node
    return None


def broker_connection(*, confirm: bool = False, timeout: float | None = None) -> Connection:
    """This thread's connection for (BROKER_URL, confirm, timeout), connected.

    Connects with one quick attempt per node (no sleeping between tries: a cluster's
    lost node costs one refused connection): the callers are an API request, the
    dispatcher loop or an operator, and each has its own retry. Raises the
    broker's connection error when it cannot be reached; the connection is then dropped.
    """
    if not settings.JOBOPS_BROKER:
        raise BrokerOffError()
    key = (settings.BROKER_URL, confirm, timeout)
    cache: dict[tuple[Any, ...], Connection] = _local.__dict__.setdefault("connections", {})
    for stale in [k for k in cache if k[0] != key[0]]:  # BROKER_URL changed
        _release(cache.pop(stale))
    conn = cache.get(key)
    if conn is None:
        conn = cache[key] = broker_connect(confirm=confirm, timeout=timeout)
    try:
        broker_connect_now(conn)
    except Exception:
        broker_connection_drop(conn)
        raise
    return conn


def broker_connection_drop(conn: Connection | None = None) -> None:
    """Forget `conn` (or every connection of this thread) after an error: its channel
    state is unknown, so the next call starts afresh."""
    cache: dict[tuple[Any, ...], Connection] = _local.__dict__.setdefault("connections", {})
    for key in [k for k, c in cache.items() if conn is None or c is conn]:
        _release(cache.pop(key))


def _release(conn: Connection) -> None:
    try:
        conn.release()
    except Exception:  # a broken connection may fail to close
        pass


@contextmanager
def broker_channel(connection: Connection | None = None) -> Iterator[Any]:
    """A new channel on `connection`, or on this thread's connection; closed after.

    An error inside drops this thread's connection (not a caller's own).
    """
    conn = connection or broker_connection()
    try:
        channel = conn.channel()
    except Exception:
        if connection is None:
            broker_connection_drop(conn)
        raise
    try:
        yield channel
    except Exception:
        if connection is None:
            broker_connection_drop(conn)
        raise
    finally:
        channel_close_quietly(channel)


# connection -> its confirm-mode channel (and that channel's Confirms), kept for the next
# batch. Weak: a dropped connection takes its entry with it.
_confirm_channels: weakref.WeakKeyDictionary[Connection, tuple[Any, Confirms]] = (
    weakref.WeakKeyDictionary()
)


def confirm_channel(conn: Connection) -> tuple[Any, Confirms]:
    """A channel of `conn` in confirm mode, and its Confirms, ready for a batch.

    Kept open between batches: opening a channel and selecting confirms costs two round
    trips and, for the dispatcher publishing a few jobs after each NOTIFY, more than
    the publishes themselves. A caller whose batch fails drops the connection
    (`broker_connection_drop`), and the channel with it; a channel the broker closed is
    replaced.
    """
    cached = _confirm_channels.get(conn)
    if cached is not None and cached[0].is_open:
        channel, confirms = cached
        try:
            confirms.new_batch()
            return channel, confirms
        except PublishError:  # a batch abandoned half way: start on a fresh channel
            channel_close_quietly(channel)
    channel = conn.channel()
    confirms = Confirms.select(channel)
    _confirm_channels[conn] = (channel, confirms)
    return channel, confirms


def channel_close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # a channel closed by the broker (404) cannot close again
        pass


def queue_depths(
    names: list[str], *, connection: Connection | None = None
) -> dict[str, int | None]:
    """Messages ready in each queue (a passive declare: nothing is created or changed;
    unacked messages are not counted); None where the broker has no such queue.

    Raises the broker's connection error when RabbitMQ cannot be reached.
    """
    depths: dict[str, int | None] = {}
    with broker_channel(connection) as channel:
        conn = channel.connection  # a channel the broker closed no longer knows it
        for name in names:
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
            except conn.channel_errors:
                # A 404 closes the channel: note nothing, carry on with a fresh one.
                depths[name] = None
                channel_close_quietly(channel)
                channel = conn.channel()
                continue
            depths[name] = int(count)
        channel_close_quietly(channel)
    return depths


class PublishError(Exception):
    """The broker could not take a batch: confirms missing in time, or (for callers that
    need every message through) a message nacked or returned."""


@dataclass
class Confirms:
    """Publisher confirms of one channel in confirm mode: delivery tags 1, 2, ... in
    publish order, settled by the broker's acks and nacks; with `mandatory`, an
    unroutable message comes back as a basic.return before its ack (which alone would
    look like success).

    Publishing a batch this way costs one wait for all its confirms, not one per message
    (kombu's `confirm_publish` mode waits after each publish).
    """

    channel: Any
    sent: int = 0
    pending: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    # (the returned message's properties, why): Celery and the relay set an id there.
    returned: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # Every tag below this one is settled (a `multiple` ack or nack settles up to its
    # tag): a multiple settle walks from here, not over the whole pending set, so a
    # batch costs O(messages) however the broker groups its acks.
    _floor: int = 1

    @classmethod
    def select(cls, channel: Any) -> Confirms:
        """Put `channel` in confirm mode and track its confirms from now on."""
        confirms = cls(channel)
        channel.events["basic_ack"].add(confirms._on_ack)
        channel.events["basic_nack"].add(confirms._on_nack)
        channel.events["basic_return"].add(confirms._on_return)
        channel.confirm_select()
        return confirms

    def new_batch(self) -> None:
        """Start the next batch on this channel: the previous one was waited for (its
        tags are settled); its nacks and returns are forgotten. Tags keep counting."""
        if self.pending:
            raise PublishError(f"{len(self.pending)} confirms of an earlier batch missing")
        self.nacked.clear()
        self.returned.clear()

    def published(self) -> int:
        """Count one message just published; returns its delivery tag."""
        self.sent += 1
        self.pending.add(self.sent)
        return self.sent

    def _settle(self, tag: int, multiple: bool) -> set[int]:
        if multiple:
            settled = {t for t in range(self._floor, tag + 1) if t in self.pending}
            self._floor = max(self._floor, tag + 1)
        else:
            settled = {tag} & self.pending
        self.pending -= settled
        return settled

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self.nacked |= self._settle(tag, multiple)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        properties = dict(getattr(message, "properties", None) or {})
        self.returned.append((properties, f"returned by {exchange or '-'}/{routing_key}: {exc}"))

    def wait(self, *, timeout: float) -> None:
        """Drain the connection until every message is settled; PublishError after
        `timeout` seconds (then nothing of the batch may count as published)."""
        deadline = time.monotonic() + timeout
        while self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError(f"{len(self.pending)} confirms missing after {timeout} s")
            self.channel.connection.drain_events(timeout=remaining)


# Messages moved per confirmed batch while a queue changes type.
CONVERT_BATCH = 500


def queue_convert(conn: Connection, queue: Queue) -> int:
    """Re-declare `queue` (a kombu Queue) with its arguments now, keeping its messages and
    its routing; returns the messages it now holds from the move. For a queue RabbitMQ
    refuses to declare (406: an argument differs, e.g. a classic DLQ to be quorum).

    1. Declare `<name>.converting` with the new arguments and the same bindings: from now
       on new messages reach it as well.
    2. Unbind the old queue; move its messages into the new one (get, publish with
       confirms through the default exchange, ack: none is lost, and a crash repeats at
       most a batch), then delete it.
    3. Declare the queue under its own name (new arguments, its bindings), unbind the
       temporary one, move its messages back, delete it.
    A message that arrives while both queues are bound reaches both: the copies are
    duplicates, as at-least-once dead-lettering already allows. Run again after a
    crash, it finishes the move (a `.converting` queue left over is emptied into the
    declared one).
    """
    temporary = queue_renamed(queue, f"{queue.name}.converting")
    channel = conn.channel()
    try:
        try:
            queue(channel).declare()
            converted = True  # already of the new type: a leftover to finish, if any
        except conn.channel_errors:
            channel_close_quietly(channel)
            channel = conn.channel()
            converted = False
        if not converted:
            temporary(channel).declare()
            for exchange, routing_key in _bindings(queue):
                channel.queue_unbind(queue.name, exchange, routing_key)
            channel = _empty_and_delete(conn, channel, queue.name, temporary.name)[0]
            # A fresh channel for the queue's new self: RabbitMQ 3.10 keeps per-channel
            # state by queue name, and a channel that used the old queue crashes
            # (541 INTERNAL_ERROR) delivering to a new one of another type.
            channel_close_quietly(channel)
            channel = conn.channel()
            queue(channel).declare()
        try:
            channel.queue_declare(temporary.name, passive=True)
        except conn.channel_errors:
            return 0  # nothing left over
        for exchange, routing_key in _bindings(queue):
            channel.queue_unbind(temporary.name, exchange, routing_key)
        channel, moved = _empty_and_delete(conn, channel, temporary.name, queue.name)
        return moved
    finally:
        channel_close_quietly(channel)


# Passes over a queue before its deletion is given up (each pass empties what it sees).
CONVERT_PASSES = 5


def _empty_and_delete(conn: Connection, channel: Any, source: str, target: str) -> tuple[Any, int]:
    """Move `source` into `target`, then delete `source` once it is seen empty (quorum
    queues refuse `if_empty`, so a passive declare counts what is left; `source` is
    unbound by now, so nothing new arrives): a conversion never deletes a message.
    Returns the channel in use and the count moved."""
    moved = 0
    for attempt in range(CONVERT_PASSES):
        moved += _move(channel, source, target)
        time.sleep(0.2 * attempt)  # a requeue settles through Raft a moment later
        if channel.queue_declare(source, passive=True)[1] == 0:
            channel.queue_delete(source)
            return channel, moved
    raise PublishError(f"{source} still holds messages; nothing deleted, run it again")


def queue_renamed(queue: Queue, name: str, **changes: Any) -> Queue:
    """A copy of a kombu Queue under another name (routing and arguments alike, unless
    `changes` says otherwise)."""
    fields = {
        "exchange": queue.exchange,
        "routing_key": queue.routing_key,
        "bindings": list(queue.bindings),
        "durable": queue.durable,
        "queue_arguments": queue.queue_arguments,
    }
    return Queue(name, **{**fields, **changes})


def _bindings(queue: Any) -> list[tuple[str, str]]:
    """(exchange, routing key) of each binding a kombu Queue declares."""
    if queue.bindings:
        return [(b.exchange.name, b.routing_key) for b in queue.bindings]
    if queue.exchange is not None and queue.exchange.name:
        return [(queue.exchange.name, queue.routing_key)]
    return []


def _move(channel: Any, source: str, target: str) -> int:
    """Every message of `source` into `target`, headers and properties as they were;
    each batch acked in `source` only once `target` confirmed all of it."""
    moved = 0
    confirms = Confirms.select(channel)
    while True:
        confirms.new_batch()
        batch: list[Any] = []
        while len(batch) < CONVERT_BATCH:
            message = channel.basic_get(queue=source, no_ack=False)
            if message is None:
                break
            batch.append(message)
        if not batch:
            return moved
        for message in batch:
            channel.basic_publish(message, exchange="", routing_key=target, mandatory=True)
            confirms.published()
        confirms.wait(timeout=settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS * 6)
        if confirms.nacked or confirms.returned:
            raise PublishError(f"moving {source} to {target}: the broker refused messages")
        channel.basic_ack(batch[-1].delivery_tag, multiple=True)
        moved += len(batch)

"""A Server-Sent Events decoder (the WHATWG "event stream interpretation"), fed line by
line: what `Client.wait` reads from a job's live stream.

Fields: `event` (the type, "message" when absent), `data` (several lines joined by
newlines), `id` (the last event id, kept across events: what a reconnect sends as
`Last-Event-ID`), `retry` (the reconnection delay, in milliseconds); lines starting with
":" are comments (keep-alives). An event is dispatched at a blank line; one cut off by
the end of the stream is dropped, as the specification says, and so is its id: the id
counts from the blank line that ends its event, so a resume never skips an event the
client did not see whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# One event's data at most: a stream that never sends a blank line cannot grow the
# client's memory without bound.
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Event:
    event: str
    data: str
    id: str | None


class StreamError(Exception):
    """The stream broke the decoder's bounds."""


class SSEDecoder:
    """Feed it lines without their line ends; it answers an Event at each blank line
    that ends one. `last_event_id` and `retry_ms` survive events, as the spec says."""

    def __init__(self, *, last_event_id: str | None = None) -> None:
        self.last_event_id = last_event_id
        self._id = last_event_id  # the spec's "last event ID buffer"
        self.retry_ms: int | None = None
        self._event = ""
        self._data: list[str] = []
        self._size = 0

    def feed(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._size += len(value) + 1
            if self._size > MAX_EVENT_BYTES:
                raise StreamError(f"an event over {MAX_EVENT_BYTES} bytes")
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:  # the spec ignores an id holding NUL
                self._id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry_ms = int(value)
        return None  # any other field is ignored

    def _dispatch(self) -> Event | None:
        self.last_event_id = self._id  # even for an event without data, as the spec says
        data, event = self._data, self._event
        self._data, self._event, self._size = [], "", 0
        if not data:
            return None  # no data: nothing to dispatch (the id, if any, is kept)
        return Event(event=event or "message", data="\n".join(data), id=self.last_event_id)


def iter_events(lines: Iterable[str], decoder: SSEDecoder) -> Iterator[Event]:
    """The events of `lines` (e.g. httpx's `iter_lines()`, which splits on CRLF, LF and
    CR alike)."""
    for line in lines:
        event = decoder.feed(line)
        if event is not None:
            yield event

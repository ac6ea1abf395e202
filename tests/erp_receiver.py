"""An ERP stand-in: a real HTTP server on 127.0.0.1 that the ERP bridge posts to."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """An ERP stand-in: answers `script` statuses in turn, then `status` (200 unless a
    test sets another: an outage is `status = 503`), with the `extra_headers` (e.g.
    Retry-After) and the body `text` when a test sets one (else `{"status": N}`);
    records each request with the status it got."""

    def __init__(self, script: list[int | tuple[str, float]] | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[dict] = []
        self.status = 200
        self.extra_headers: dict[str, str] = {}
        self.text: str | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                entry = {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                receiver.requests.append(entry)
                action = receiver.script.pop(0) if receiver.script else receiver.status
                if isinstance(action, tuple):  # ("sleep", seconds): outlive the timeout
                    time.sleep(action[1])
                    action = 200
                entry["status"] = action
                self.send_response(action)
                self.send_header("Content-Type", "application/json")
                for name, value in receiver.extra_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                text = (
                    receiver.text if receiver.text is not None else json.dumps({"status": action})
                )
                self.wfile.write(text.encode())

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/erp/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

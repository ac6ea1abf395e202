"""A webhook receiver: a real HTTP server on 127.0.0.1 that records each POST's headers
and raw body (for Webhook.verify) and answers as the test scripts it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookReceiver:
    """Answers `status` (200), except: the first `fail_first` requests get 500; each
    request of a job in `failing_jobs` gets 500; with `hang` set, every request waits
    that long before answering (past the sender's timeout)."""

    def __init__(self, *, fail_first: int = 0, hang: float = 0.0) -> None:
        self.fail_first = fail_first
        self.hang = hang
        self.status = 200
        self.failing_jobs: set[str] = set()
        self.requests: list[dict] = []
        self.started = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.started += 1
                    failing = receiver.fail_first > 0
                    receiver.fail_first -= 1
                if receiver.hang:
                    time.sleep(receiver.hang)
                body = json.loads(raw)
                status = receiver.status
                if failing or body.get("job_id") in receiver.failing_jobs:
                    status = 500
                receiver.requests.append(
                    {
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "raw": raw.decode(),
                        "body": body,
                        "status": status,
                    }
                )
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"x" * 5000 if status >= 500 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def delivered(self) -> list[dict]:
        return [r for r in self.requests if 200 <= r["status"] < 300]

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

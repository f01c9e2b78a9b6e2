"""An HTTP proxy in front of a test's S3 server that fails chosen requests, by count (no
timing): answering 503, resetting the connection, or cutting a response's body short. Tests of
`shard` and `index` against a flaky store use it with moto's server (`conftest.moto_s3`)."""
import http.client
import http.server
import socket
import threading
from dataclasses import dataclass


@dataclass
class Fault:
    """Fail the first `times` requests whose method is `method` and whose path holds `part`."""
    method: str
    part: str
    action: str  # "503", "reset" or "cut" (the body cut in half, then the connection closed)
    times: int = 1


class FaultProxy:
    """Forwards to `upstream` (host, port); `faults` are consumed as requests match them."""

    def __init__(self, upstream: tuple[str, int], faults: list[Fault]):
        self.faults = list(faults)
        self.injected: list[tuple[str, str, str]] = []
        lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _take_fault(self):
                with lock:
                    for f in proxy.faults:
                        if f.times > 0 and f.method == self.command and f.part in self.path:
                            f.times -= 1
                            proxy.injected.append((self.command, self.path, f.action))
                            return f.action
                return None

            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                fault = self._take_fault()
                if fault == "503":
                    msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.close()
                    return
                conn = http.client.HTTPConnection(*upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items()}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if fault == "cut" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            def _handle(self):
                try:
                    self._forward()
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up on a reply cut short: what the fault is for.
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @classmethod
    def before(cls, options: dict, faults: list[Fault]) -> "FaultProxy":
        """A proxy in front of the server of `options` (`moto_s3`'s storage options)."""
        host, port = options["aws_endpoint"].removeprefix("http://").split(":")
        return cls((host, int(port)), faults)

    def options(self, options: dict) -> dict:
        """`options` with their endpoint moved to this proxy."""
        return {**options, "aws_endpoint": self.endpoint}

    def close(self):
        self.server.shutdown()
        self.server.server_close()

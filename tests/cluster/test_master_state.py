"""The master's JSON view, read while its web UI is still starting (no Spark needed)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cerebro_spark.cluster import SparkDaemons


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers each GET with the next body of ``server.bodies`` (the last one repeats)."""

    def do_GET(self) -> None:
        bodies: list[bytes] = self.server.bodies  # type: ignore[attr-defined]
        body = bodies.pop(0) if len(bodies) > 1 else bodies[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ui() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answers)
    server.bodies = [b""]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_an_empty_or_partial_answer_counts_as_not_answering(
    ui: http.server.HTTPServer, tmp_path: Path
) -> None:
    daemons = SparkDaemons(tmp_path, master_ui_port=ui.server_address[1])
    ui.bodies = [b"", b'{"aliveworkers": ', b"[1, 2]", b'{"aliveworkers": 2}']  # type: ignore[attr-defined]
    assert [daemons.master_state() for _ in range(3)] == [None, None, None]
    assert daemons.alive_workers() == 2


def test_a_master_that_does_not_listen_does_not_answer(tmp_path: Path) -> None:
    daemons = SparkDaemons(tmp_path)
    assert daemons.master_state() is None and daemons.alive_workers() == -1

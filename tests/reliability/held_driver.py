"""The ``cerebro-spark`` CLI, held still for a while right after it logs a given line.

``python -m tests.reliability.held_driver TEXT SECONDS CLI-ARGS...`` runs the CLI as
``python -m cerebro_spark.cli CLI-ARGS...`` does, but the first time a log record holding
``TEXT`` has been written, the thread that logged it sleeps for up to ``SECONDS`` before it
goes on. A test that waits for that line and then signals the driver lands its signal at
that very step, however loaded the machine is: the resize's next step cannot race ahead
of it. The sleep is an ordinary ``time.sleep``, so SIGINT interrupts it as it would the
driver's own waits (``KeyboardInterrupt`` raised where the line was logged).

With ``CEREBRO_TEST_HOLD_RELEASE`` set to a path, the hold also ends as soon as a file
exists there: a test that has done what it needed the driver held for lets it go on.
While held, any other thread that logs waits too (the handler's lock): hold at a step
where the driver's other threads have nothing to say.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from cerebro_spark import cli

RELEASE_ENV = "CEREBRO_TEST_HOLD_RELEASE"
"""A path: the hold ends once a file exists there."""


class Hold(logging.Handler):
    """Sleeps in the logging thread after the first record holding ``text``."""

    def __init__(self, text: str, seconds: float, release: str | None = None) -> None:
        super().__init__()
        self.text = text
        self.seconds = seconds
        self.release_file = release
        self._held = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self._held.is_set() or self.text not in record.getMessage():
            return
        self._held.set()
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            if self.release_file is not None and os.path.exists(self.release_file):
                return
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    text, seconds, *cli_args = argv
    # The CLI's own configuration (its basicConfig is then a no-op); the hold goes after
    # the stream handler, so that the line is out before the driver stops.
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger().addHandler(Hold(text, float(seconds), os.environ.get(RELEASE_ENV)))
    return cli.main(cli_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

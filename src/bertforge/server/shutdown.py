"""Running the app under uvicorn with a bounded shutdown: after SIGTERM (or Ctrl-C) the process is gone within
`graceful_timeout_s`, whatever its clients do.

uvicorn alone waits for every open connection to finish its response (`timeout_graceful_shutdown` None: forever),
so one client that sent a request and stopped reading held a SIGTERM indefinitely. Here requests in flight get all
but `reserve(graceful_timeout_s)` of it (uvicorn's `timeout_graceful_shutdown`: then it cancels them, which drops
their queued work), the rest is for the app's lifespan to stop the batcher; and a timer started by the signal ends
the process at `graceful_timeout_s` in any case (a batch still computing, a thread that does not stop), by the same
signal, so the exit status is the one a graceful stop gives.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


def reserve(graceful_timeout_s: float) -> float:
    """Seconds of the graceful timeout kept for stopping the batcher after requests in flight are given up on."""
    return min(2.0, graceful_timeout_s / 4)


def run(app: Any, graceful_timeout_s: float, **config: Any) -> None:
    """`uvicorn.run(app, **config)` with the bounded shutdown (see the module docstring)."""
    import uvicorn

    class Server(uvicorn.Server):
        _deadline: threading.Timer | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._deadline is None:
                self._deadline = threading.Timer(graceful_timeout_s, _exit_now, (sig, graceful_timeout_s))
                self._deadline.daemon = True
                self._deadline.start()
            super().handle_exit(sig, frame)

    cfg = uvicorn.Config(app, timeout_graceful_shutdown=max(graceful_timeout_s - reserve(graceful_timeout_s), 0.1),
                         **config)
    server = Server(cfg)
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run
        pass
    finally:
        if server._deadline is not None:
            server._deadline.cancel()
    if not server.started:  # e.g. the port is taken: uvicorn has said so
        sys.exit(3)


def _exit_now(sig: int, seconds: float) -> None:
    print(f"bertforge serve: still stopping {seconds:g} s after the signal (--graceful-timeout): exiting now",
          file=sys.stderr, flush=True)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is not to end the process

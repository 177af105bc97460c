"""The worker process's side of launch/local.py: read the kernel's messages, run each call on the main thread.

Started as `python -m workbench.launch.workerside IN OUT PARENT FOLDER` by `LocalWorker.start`: IN and OUT
are the pipes' file descriptors, PARENT the kernel's pid (the worker ends with it: fresh.end_with_caller),
FOLDER the worker's private folder. Messages are length-framed pickles; calls and workloads inside them
are cloudpickled (see local.py for the protocol).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_CURRENT: dict[str, Any] = {"cancel": None}  # the running call's stop event


def current_cancel() -> Any:
    """Inside a worker: the stop event of the call it runs (set when the kernel stops the trial); else None."""
    return _CURRENT["cancel"]


class Ref:
    """A workload the worker already holds, by its key (sent once, then named in each call)."""

    def __init__(self, key: str) -> None:
        self.key = key


def worker_main(rfd: int, wfd: int, parent: int, folder: str, started: float | None = None) -> int:
    """The worker's body: read messages on a thread (the pipe never fills), run calls on the main thread."""
    import pickle

    inbox: queue.Queue = queue.Queue()
    conn_in, conn_out = Connection(rfd, writable=False), Connection(wfd, readable=False)
    stops: set[int] = set()
    running: dict[str, Any] = {"tid": None}

    def reader() -> None:
        try:
            while True:
                msg = pickle.loads(conn_in.recv_bytes())
                if msg[0] == "stop":
                    stops.add(msg[1])
                    ev = _CURRENT["cancel"]
                    if running["tid"] == msg[1] and ev is not None:
                        ev.reason = "stopped by the user"
                        ev.set()
                    continue
                inbox.put(msg)
        except (EOFError, OSError):
            inbox.put(("exit",))

    threading.Thread(target=reader, name="workbench-worker-inbox", daemon=True).start()
    from .fresh import end_with_caller

    threading.Thread(target=end_with_caller, args=(parent, started, Path(folder)), name="workbench-caller-watch",
                     daemon=True).start()
    import cloudpickle
    import torch  # already imported with the package (`python -m workbench.launch.workerside`): its start-up is paid

    def send(msg: tuple) -> None:
        conn_out.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    send(("ready", {"pid": os.getpid(), "torch": torch.__version__, "threads": torch.get_num_threads()}))
    workloads: dict[str, Any] = {}
    while True:
        msg = inbox.get()
        if msg[0] == "exit":
            return 0
        if msg[0] == "workload":
            t = time.monotonic()
            try:
                workloads[msg[1]] = cloudpickle.loads(msg[2])
            except Exception:  # it cannot load here: each call that names it says why
                workloads[msg[1]] = _Unloadable(traceback.format_exc())
            send(("loaded", msg[1], time.monotonic() - t, len(msg[2])))
            continue
        tid = msg[1]
        if tid in stops:
            send(("done", tid, cloudpickle.dumps(("error", "stopped before it started"))))
            continue
        running["tid"] = tid
        _CURRENT["cancel"] = threading.Event()
        try:
            fn, args, kwargs = cloudpickle.loads(msg[2])

            def deref(value: Any) -> Any:
                if not isinstance(value, Ref):
                    return value
                got = workloads.get(value.key)
                if isinstance(got, _Unloadable):
                    raise RuntimeError(f"the worker could not load the workload: {got.text}")
                return got

            args = tuple(deref(a) for a in args)
            if args and isinstance(args[0], dict):
                args = ({k: deref(v) for k, v in args[0].items()}, *args[1:])
            outcome: tuple = ("ok", fn(*args, **kwargs))
        except BaseException as e:  # the call's own error, as text; the worker goes on
            outcome = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}".strip())
        finally:
            running["tid"] = None
            _CURRENT["cancel"] = None
        try:
            blob = cloudpickle.dumps(outcome)
        except Exception as e:  # an unpicklable value
            blob = cloudpickle.dumps(("error", f"the call's value cannot be pickled: {type(e).__name__}: {e}"))
        send(("done", tid, blob))


class _Unloadable:
    def __init__(self, text: str) -> None:
        self.text = text.strip().splitlines()[-1] if text.strip() else "unknown error"


if __name__ == "__main__":  # the package's module, not this __main__ copy: its Ref and _CURRENT are the calls'
    from workbench.launch.workerside import worker_main as _main

    sys.exit(_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                   None if sys.argv[5] == "-" else float(sys.argv[5])))

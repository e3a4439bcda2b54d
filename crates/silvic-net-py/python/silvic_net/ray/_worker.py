"""What one Ray Train worker process holds for its group's ring, between the backend's calls.

The backend's tasks (bind, connect, close) run on the worker actor's own thread, the train loop
in a thread Ray Train starts, and :class:`silvic_net.ray.train.HangReport`'s polls on the actor
thread again while the train loop may be blocked in a collective: all of them meet here, under
one lock held only to read or swap these references.
"""

from __future__ import annotations

import linecache
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from silvic_net import RingListener, RingWatch, TcpCollective


class _WorkerState:
    def __init__(self) -> None:
        self.listener: Optional[RingListener] = None
        self.ring: Optional[TcpCollective] = None
        self.watch: Optional[RingWatch] = None
        # The thread that runs the train loop, for the hang report's "where is it".
        self.train_thread: Optional[int] = None


_lock = threading.Lock()
_worker = _WorkerState()


@contextmanager
def _train_thread() -> Iterator[None]:
    """Wraps the train loop (in the thread that runs it): records which thread that is."""
    with _lock:
        _worker.train_thread = threading.get_ident()
    try:
        yield
    finally:
        with _lock:
            _worker.train_thread = None


def _progress() -> Optional[dict[str, Any]]:
    """This worker's ring progress (:meth:`silvic_net.RingWatch.progress`) and, as ``"at"``,
    the line its train loop is on; ``None`` before the ring is formed."""
    with _lock:
        watch, thread = _worker.watch, _worker.train_thread
    if watch is None:
        return None
    progress: dict[str, Any] = dict(watch.progress())
    frame = sys._current_frames().get(thread) if thread is not None else None
    if frame is not None:
        code = frame.f_code
        where = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
        line = linecache.getline(code.co_filename, frame.f_lineno).strip()
        progress["at"] = f"{where}: {line}" if line else where
    return progress

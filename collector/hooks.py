"""The in-loop hook: what a training loop calls each step. It never raises, never blocks.

Per step it measures the step time and named sections (data wait, forward, backward,
optimizer, checkpoint), takes the metrics the loop reports (loss, grad norm, learning rate,
tokens) and times the collectives it is told about. At the end of the step everything goes
as one batch into a bounded queue; a background thread sends it. When the queue is full
the batch is dropped and counted, so a slow or absent controller never slows training.

>>> sent = []
>>> hook = TrainingHook(lambda labels, rows: sent.append(rows) or True, {"rank": "0"})
>>> hook.step_start(1)
>>> with hook.section("forward"):
...     pass
>>> hook.step_end(1, loss=2.0)
>>> hook.close()
>>> sorted(row[0] for row in sent[0])
['loss', 'section.forward', 'step_time']
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

Row = list[Any]
SendFn = Callable[[Mapping[str, str], Sequence[Row]], bool]
_STOP = object()


class TrainingHook:
    """Per-rank telemetry from inside the training loop.

    Args:
        send: delivers one batch (labels, rows); returns False if it had to drop it.
        labels: labels of every sample of this rank (rank, replica, node, attempt).
        queue_size: batches held before new ones are dropped.
        clock: wall-clock time source, seconds.
    """

    def __init__(
        self,
        send: SendFn,
        labels: Mapping[str, str],
        queue_size: int = 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._send = send
        self.labels = dict(labels)
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._rows: Row = []
        self._step: int | None = None
        self._step_started = 0.0
        self._sequence: dict[str, int] = {}
        self._errors_seen: set[str] = set()
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="eagleeye-hook", daemon=True)
        self._thread.start()

    # ---- the loop's API -------------------------------------------------------------
    def step_start(self, step: int) -> None:
        self._step = step
        self._rows = []
        self._step_started = time.perf_counter()

    def step_end(self, step: int | None = None, **metrics: float) -> None:
        """Closes the step: records step_time and the given metrics, then enqueues."""
        try:
            now = self._clock()
            step = self._step if step is None else step
            elapsed = time.perf_counter() - self._step_started
            rows = self._rows
            rows.append(["step_time", elapsed, now, step])
            for name, value in metrics.items():
                number = _number(value)
                rows.append([name, number, now, step])
                if not math.isfinite(number):  # NaN/Inf flags: the hard rule's input
                    rows.append([f"nonfinite.{name}", 1.0, now, step])
            self._rows = []
            self._enqueue(rows)
        except Exception as exc:  # the hot path never raises into the loop
            self._note_error(exc)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Times a named part of the step (``data``, ``forward``, ``backward``, ...)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._rows.append(
                [f"section.{name}", time.perf_counter() - started, self._clock(), self._step]
            )

    @contextmanager
    def collective(self, op: str, nbytes: int = 0, group: str = "world") -> Iterator[None]:
        """Times one collective; records enter/exit, op, bytes, group and sequence number."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record_collective(op, nbytes, group, time.perf_counter() - started)

    def record_collective(self, op: str, nbytes: int, group: str, duration: float) -> None:
        """Records one collective that took ``duration`` seconds and ended now."""
        seq = self._sequence.get(group, 0)
        self._sequence[group] = seq + 1
        extra = {"op": op, "group": group, "seq": str(seq), "bytes": str(nbytes)}
        self._rows.append(["collective", duration, self._clock(), self._step, extra])

    def record(self, name: str, value: float) -> None:
        """Adds a metric to the current step."""
        self._rows.append([name, _number(value), self._clock(), self._step])

    def event(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Sends a one-off event (a checkpoint saved, a fault injected) right away."""
        extra = {k: str(v) for k, v in labels.items()}
        self._enqueue([[name, _number(value), self._clock(), self._step, extra]])

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Waits until everything queued was handed to the transport; True if it was."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 2.0) -> None:
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    # ---- internals -------------------------------------------------------------------
    def _enqueue(self, rows: Row) -> None:
        try:
            self._queue.put_nowait(rows)
        except queue.Full:
            self.dropped += len(rows)

    def _drain(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is _STOP:
                    return
                if not self._send(self.labels, batch):
                    self.dropped += len(batch)
            except Exception as exc:
                self.dropped += len(batch)
                self._note_error(exc)
            finally:
                self._queue.task_done()

    def _note_error(self, exc: Exception) -> None:
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._errors_seen:  # log each distinct error once
            self._errors_seen.add(key)
            log.warning("eagleeye hook error (telemetry dropped, training unaffected): %s", key)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan

"""The hang report of :mod:`silvic_net.ray.train`: which rank a stalled ring waits on.

:class:`HangReport` polls every worker's :class:`silvic_net.RingWatch` from Ray Train's
controller, at each of its health checks (every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by
default), without ever blocking it: a poll that has not answered is looked at again at the next
check. :func:`diagnose` is the pure half: from one round of answers it names the ranks that
have not reached the call the others have waited in for longest. Ranks of one ring count their
calls alike (the ``index`` of a call is the same on every rank), so while rank r waits in call
``i``, a rank whose ``entered`` is at most ``i`` has not reached it: that rank is the one every
other rank ends up waiting on. A rank whose poll does not answer (its actor is stopped, or its
process holds the GIL) is named too.

Not here: a ring whose every rank is in the same call (a stalled link or host between them)
names no rank; each rank's collective timeout does, naming the peer it waits on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import ray
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2.api.exceptions import WorkerGroupError

from silvic_net.ray._worker import _progress

__all__ = ["Hang", "HangReport", "RingHangError", "diagnose"]

logger = logging.getLogger("silvic_net.ray.train")


class RingHangError(WorkerGroupError):
    """The run failed because a ring's collective waited past ``HangReport(fail_after=...)``.

    ``waited_on`` lists the ranks the others waited on (empty when every rank was in the same
    call); ``report`` is the hang report's text. A ``WorkerGroupError``: Ray Train's
    ``FailureConfig(max_failures=...)`` retries it like a worker's failure.
    """

    def __init__(self, report: str, waited_on: Sequence[int]) -> None:
        super().__init__(report, worker_failures={})
        self.report = report
        self.waited_on = list(waited_on)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.report, self.waited_on))


@dataclass(frozen=True)
class Hang:
    """One diagnosis of :func:`diagnose`."""

    #: How long the longest-waiting rank has been in its call, in seconds.
    waited: float
    #: That call: its index since the ring formed and its op.
    index: int
    op: str
    #: The ranks in that call, and those that have not reached it or did not answer.
    waiting: list[int]
    waited_on: list[int]
    #: The report, one line per rank.
    text: str


def _describe(rank: int, p: Optional[dict[str, Any]], answer_within: float) -> str:
    if p is None:
        return f"rank {rank}: did not answer the poll within {answer_within:.0f} s"
    if p.get("op") is not None:
        line = f"rank {rank}: in {p['op']} #{p['index']} for {p['in_call']:.1f} s"
    elif p.get("failed"):
        line = f"rank {rank}: its ring has failed"
    elif p.get("since_return") is None:
        line = f"rank {rank}: has called no collective yet"
    else:
        line = (
            f"rank {rank}: not in a collective for {p['since_return']:.1f} s "
            f"(it has returned from {p['entered']} calls, the last #{p['entered'] - 1})"
        )
    if p.get("at"):
        line += f"; its train loop is at {p['at']}"
    return line


def diagnose(
    answers: dict[int, Optional[dict[str, Any]]], threshold: float, answer_within: float
) -> Optional[Hang]:
    """A :class:`Hang` if a rank has been in one collective for ``threshold`` seconds or more.

    ``answers`` maps every world rank to its worker's progress (``RingWatch.progress()``,
    plus ``"at"``, where its train loop is), or to ``None`` if the worker did not answer within
    ``answer_within`` seconds; a worker with no ring yet is left out.
    """
    in_call = {r: p for r, p in answers.items() if p is not None and p.get("op") is not None}
    if not in_call:
        return None
    longest = max(in_call, key=lambda r: float(in_call[r]["in_call"]))
    waited = float(in_call[longest]["in_call"])
    if waited < threshold:
        return None
    index, op = int(in_call[longest]["index"]), str(in_call[longest]["op"])
    waiting = sorted(r for r, p in in_call.items() if p["index"] == index)
    waited_on = sorted(r for r, p in answers.items() if p is None or int(p["entered"]) <= index)
    if waited_on:
        ranks = ", ".join(map(str, waited_on))
        head = (
            f"silvic-net hang report: {len(waiting)} of {len(answers)} ranks have waited up to "
            f"{waited:.1f} s in {op} #{index} on rank{'s' if len(waited_on) > 1 else ''} "
            f"{ranks}, which {'have' if len(waited_on) > 1 else 'has'} not reached it"
        )
    else:
        head = (
            f"silvic-net hang report: every rank has entered {op} #{index}, the longest "
            f"{waited:.1f} s ago, and none is behind: the ring is stalled between ranks (a link "
            f"or a host); each rank's collective timeout will name the peer it waits on"
        )
    lines = [head] + ["  " + _describe(r, answers[r], answer_within) for r in sorted(answers)]
    return Hang(waited, index, op, waiting, waited_on, "\n".join(lines))


class HangReport(WorkerGroupCallback):
    """A Ray Train callback (``RunConfig(callbacks=[HangReport(...)])``) that names the rank a
    stalled silvic-net ring waits on.

    When a worker's collective has waited ``report_after`` seconds, it logs a warning (logger
    ``"silvic_net.ray.train"``, on the Train controller) with one line per rank: which call it
    is in and for how long, or how long since it last returned and which line its train loop is
    on. It warns again each time the wait doubles. With ``fail_after``, a wait that long fails
    the attempt with a :class:`RingHangError` naming the rank; ``FailureConfig`` then retries
    or ends the run. ``answer_within`` is how long a worker may take to answer a poll before
    the report names it as not answering.
    """

    def __init__(
        self,
        report_after: float = 60.0,
        fail_after: Optional[float] = None,
        answer_within: float = 10.0,
    ) -> None:
        if not report_after > 0:
            raise ValueError(f"report_after must be positive, got {report_after}")
        if fail_after is not None and not fail_after >= report_after:
            raise ValueError(
                f"fail_after ({fail_after}) must be at least report_after ({report_after})"
            )
        self.report_after = report_after
        self.fail_after = fail_after
        self.answer_within = answer_within
        self._workers: list[tuple[int, Any]] = []  # (world rank, Ray Train worker)
        self._round: Optional[tuple[float, dict[int, Any]]] = None  # (sent at, rank -> ref)
        self._next_report = report_after

    def after_worker_group_start(self, worker_group: Any) -> None:
        self._workers = [(w.distributed_context.world_rank, w) for w in worker_group.get_workers()]
        self._round = None
        self._next_report = self.report_after

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        self._workers = []
        self._round = None

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        # One round of polls in flight at a time: sent at one health check, read at a later
        # one (so the controller never waits on a worker), and the next round sent at once. A
        # worker that has not answered keeps its poll: no second one queues behind it.
        if not self._workers:
            return
        unanswered: dict[int, Any] = {}
        if self._round is not None:
            sent, refs = self._round
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
            if len(ready) < len(refs) and time.monotonic() - sent < self.answer_within:
                return  # look again at the next health check
            self._round = None
            answers = self._answers(refs, set(ready))
            if answers is not None:
                self._judge(answers)
            unanswered = {rank: ref for rank, ref in refs.items() if ref not in set(ready)}
        self._round = (
            time.monotonic(),
            {
                rank: unanswered[rank] if rank in unanswered else w.execute_async(_progress)
                for rank, w in self._workers
            },
        )

    @staticmethod
    def _answers(refs: dict[int, Any], ready: set[Any]) -> Optional[dict[int, Any]]:
        """Each rank's answer (``None``: it did not answer in time), or ``None`` if there is
        nothing to compare: a worker died (Ray Train reports that itself) or has no ring yet."""
        answers: dict[int, Optional[dict[str, Any]]] = {}
        for rank, ref in refs.items():
            if ref not in ready:
                answers[rank] = None
                continue
            try:
                answer = ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead worker
                return None
            if answer is None:
                return None
            answers[rank] = answer
        return answers

    def _judge(self, answers: dict[int, Optional[dict[str, Any]]]) -> None:
        hang = diagnose(answers, self.report_after, self.answer_within)
        if hang is None:
            self._next_report = self.report_after
            return
        if self.fail_after is not None and hang.waited >= self.fail_after:
            text = f"{hang.text}\nfailing the attempt: it waited past fail_after={self.fail_after:g} s"
            logger.error("%s", text)
            raise RingHangError(text, hang.waited_on)
        if hang.waited >= self._next_report:
            logger.warning("%s", hang.text)
            self._next_report = 2 * hang.waited

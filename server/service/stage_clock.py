"""The coordinator's CPU seconds per secure-round stage (``stage_cpu``), for its reports and the
simulator's (``simulate --json``: ``secure_aggregation.stage_cpu_seconds``).

A round's work is done with its lock held: a device's stage message parsed and stored, a fetch
answered, a stage closed (at MASKED_INPUT of a validated study, preparing every report's
leader share and the exchange with the helper; at UNMASK of SecAgg+, rebuilding the seeds and
removing the masks). :meth:`StageClock._timed` adds the thread CPU seconds
(:func:`time.thread_time`: this thread's user + system time, not the time it waits for the lock
or for the helper's answers) spent inside it to the stage that was open when it started, so a
stage's figure includes its closing. Not counted: the gRPC edge's work before the round is
reached (TLS, deserializing, the device's signature check) and the decoding after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from fedsketch.common.pb import fedsketch_pb2 as pb


class StageClock:
    """A mixin for a round with an open ``stage`` (a ``pb.Stage``): :attr:`stage_cpu` maps each
    stage's name to the thread CPU seconds spent in it (module docstring)."""

    stage: int

    @property
    def stage_cpu(self) -> dict[str, float]:
        """Stage name -> CPU seconds the coordinator spent in :meth:`_timed` for it."""
        return self.__dict__.setdefault("_stage_cpu", {})

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Count this thread's CPU seconds inside the block against the open stage."""
        stage, start = pb.Stage.Name(self.stage), time.thread_time()
        try:
            yield
        finally:
            self.stage_cpu[stage] = self.stage_cpu.get(stage, 0.0) + time.thread_time() - start

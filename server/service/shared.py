"""What a coordinator sharing its database with others (``serve --shared``) does differently: it
takes up their unfinished decoding, and it serves every running secure-aggregation round, those
another coordinator started included (:mod:`.shared_round`).

A study closes in whichever coordinator made its DECODE transition, which then decodes it under
the study's claim (:meth:`~fedsketch.server.store.base.Store.claim`). If that coordinator dies
first, the study stays ``decoding`` with its claim free (the claim ends with the process). Every
:data:`SWEEP_SECONDS`, the deadline watcher of each shared coordinator queues on its decoder every
decoding study whose claim nobody holds; the decoder step claims it and re-reads it, so a study is
decoded once whoever queued it (one that another coordinator finished meanwhile is left alone), and
a study whose refinement round is collecting costs one read of its rounds. A coordinator that
serves its database alone resumes only at start-up, where it is the only one that could.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.store.base import Store, StudyRow

#: How often (seconds) a shared coordinator looks for decoding studies nobody is working on.
SWEEP_SECONDS = 15.0


class Shared:
    """Mixin of :class:`~fedsketch.server.service.coordinator.Coordinator`: :meth:`_sweep` and
    :meth:`_adopt`."""

    store: Store
    _decoder: Executor
    _decode: Callable[[str], None]
    _adopted: Callable[[str], SecAggRound | None]
    _next_sweep: float = 0.0

    def _sweep(self, now: float) -> None:
        """Queue the decoding studies whose claim is free, if the store is shared and the last
        sweep is :data:`SWEEP_SECONDS` old (``now``: Unix seconds)."""
        if not self.store.shared or now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_SECONDS
        for row in self.store.list_studies(("decoding",)):
            if not self.store.claimed(row.parent or row.study_id):  # a round's claim is its study's
                self._decoder.submit(self._decode, row.study_id)

    def _adopt(self, accepting: list[StudyRow]) -> None:
        """If the store is shared, take up the secure rounds of the ``accepting`` studies that
        another coordinator started, so that this one's watcher closes their stages by their
        timeouts too (should the one that started them die)."""
        if self.store.shared:
            for row in accepting:
                self._adopted(row.study_id)

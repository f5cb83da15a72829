"""A secure-aggregation round served by several coordinators sharing one database
(``serve --shared``): any of them takes any device's stage message and answers any fetch, at
any stage, and each stage closes once.

The store is the round (:mod:`.secure_round`, Durability): every stage message is kept before
it is acknowledged, every stage that opens is recorded with when it opened, and the round's end
with its unmasked sum; what a coordinator holds in memory (the aggregator, the routed bundles)
is a deterministic function of that. So a :class:`SharedRound` does everything a
:class:`~.secure_round.SecAggRound` does, but each call (:meth:`~.secure_round.SecAggRound.receive`,
:meth:`~.secure_round.SecAggRound.fetch`, :meth:`~.secure_round.SecAggRound.tick`) first takes
the round's lock in the database (the store's claim on :data:`ROUND_CLAIM` + the study id: a
session advisory lock, released if its process dies) and catches up with the store: the
messages of the open stage it has not seen yet are parsed and taken in, and a stage another
coordinator closed meanwhile is closed here the same way from its kept messages (no store
write: the stage it opened is already recorded), as :meth:`~.secure_round.SecAggRound.resume`
does after a restart from REGISTER. The message is then checked against that current state,
kept and acknowledged, and a stage it fills (or whose timeout passed: every coordinator's
deadline watcher ticks every running round) closes, its next stage or its end stored, all
under the lock: whoever holds it next sees it. A catch-up reads one row and the messages it
lacks (the open stage's new ones, any later stage's), so each message is read and parsed about
once per coordinator, not once per call. A coordinator that takes up a round another started
(:meth:`~.secure_studies.SecureStudies._adopted`) starts it blank and replays it whole on its
first call. A call that fails other than by a refusal (the database went away mid-stage) drops
the copy, rebuilt from the store on the next call, so no coordinator ever acts on a state the
store does not hold.

Reads of a round (its stage, shown to devices and operators; its roster and who is in the sum,
for who may read what) check the stored stage (one read) and catch up only when it moved
(:meth:`SharedRound.follow`). The round's end is stored by whoever closed UNMASK, which then
decodes the sum under the study's claim; if it dies first, any shared coordinator's sweep takes
the study up from the stored sum (:mod:`.shared`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.server.errors import Refusal
from fedsketch.server.service.secure_round import SecAggRound

#: The store's claim that serializes a shared round's calls across coordinators: this prefix
#: and the study id (a key of its own, apart from the study's decoding claim).
ROUND_CLAIM = "secagg-round/"


class SharedRound(SecAggRound):
    """A :class:`~.secure_round.SecAggRound` that holds the round's lock in the database and
    catches up with the store before each call (module docstring)."""

    @contextmanager
    def _held(self) -> Iterator[None]:
        with self._lock, self._store.claim(ROUND_CLAIM + self.study_id):
            try:
                self._catch_up()
                yield
            except Refusal:
                raise  # a refused message or fetch: nothing changed
            except BaseException:
                self._blank()  # rebuilt from the store on the next call
                raise

    def _catch_up(self) -> None:
        """Bring the round to what the store holds (both locks held): its end, or the stage it
        records, with every kept message."""
        if self.finished:
            return
        row = self._store.secure_round(self.study_id)
        if row is not None and row.ended:
            self._ended_as(row.members or {})
            return
        at = pb.REGISTER if row is None else row.stage
        if sw.STAGES.index(at) < sw.STAGES.index(self.stage):  # a stage we opened is not stored
            self._blank()
        stages = sw.STAGES[sw.STAGES.index(self.stage):]
        self._replay(row, self._store.stage_messages(self.study_id, stages,
                                                     tuple(self._inbox[self.stage])))

    def follow(self) -> None:
        """Catch up if the store records the round at another stage than this copy (one read of
        the store otherwise)."""
        if self.finished:
            return
        row = self._store.secure_round(self.study_id)
        if row is not None and (row.ended or row.stage != self.stage):
            with self._held():
                pass

    def members(self) -> dict[str, bool]:
        self.follow()
        return super().members()

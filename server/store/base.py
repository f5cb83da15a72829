"""The coordinator's domain model and storage contract, independent of any database.

Everything the coordinator persists or refuses is named here once: the study
states and the transitions between them, the row types, and the abstract :class:`Store` that a
backend implements (:mod:`fedsketch.server.store.sql`, on SQLite or PostgreSQL). The service and
the store raise the same :class:`~fedsketch.server.errors.Refusal`; only the gRPC layer
(:mod:`fedsketch.server.service.api`) turns its code into a status, so neither of them depends
on the transport.

Study lifecycle (each row is one :class:`Transition` below; nothing else moves a study)::

    COLLECT          open              -> collecting  its first contribution is stored
    DECODE           open | collecting -> decoding    closed with quorum, or secure aggregate unmasked
    ABANDON          open | collecting -> failed      closed without quorum; secure aggregation
                                                      aborted
    PUBLISH          decoding          -> done        its result is stored
    DECODING_FAILED  decoding          -> failed      the decoder raised

A plain study also has a roster: devices join it with :meth:`Store.register` (spending nothing);
once ``min_devices`` have joined (the quorum: the study can finish) the roster is *filled*
(``filled_at``, for good) and the store takes contributions, only from roster devices. The
roster keeps taking devices up to its ``capacity`` (the spec's ``roster``, at least the quorum),
so devices that never send do not stop the study. The stage a device sees (REGISTER, then
PLAIN_INPUT) follows from ``filled_at``, so it needs no state of its own.

The store makes COLLECT and PUBLISH itself, inside the write that causes them, and a secure
round's DECODE or ABANDON in :meth:`Store.end_secure_round`; the coordinator makes the others with
``Store.set_state(..., expect=t.sources)``, a compare-and-set, so a study that moved meanwhile
(two closes racing) is left alone and the loser is refused.

The module runs past 400 lines because the contract is one: every method a backend implements,
each with the semantics, refusals and transactions every backend must keep, read in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

from fedsketch.server.errors import Refusal


class StoreError(Refusal):
    """A refusal by the store (unknown study, used token, closed study, unreadable file...)."""


#: Study states, in lifecycle order: a study is created in the first (``studies.state``; the API
#: maps each to ``StudyState``).
STATES = ("open", "collecting", "decoding", "done", "failed")
#: States in which a study accepts contributions or stage messages.
ACCEPTING = ("open", "collecting")
#: How a contribution's payload travels (``ContributionRow.kind``, the ``Contribution`` oneof).
KINDS = ("int32_pairs", "int64_pairs", "int64_cells")
#: Why a device declined a study, as it reported it (``refusals.reason``; the API maps each to
#: the proto's ``RefusalReason`` of the same name in capitals).
REFUSAL_REASONS = ("budget", "policy", "too_few_records", "too_many_records", "data_unreadable",
                   "dimension_mismatch", "spec_mismatch", "other")


class Transition(NamedTuple):
    """One edge of the study lifecycle: a study in one of ``sources`` may move to ``target``."""

    sources: tuple[str, ...]
    target: str


COLLECT = Transition(("open",), "collecting")
DECODE = Transition(ACCEPTING, "decoding")
ABANDON = Transition(ACCEPTING, "failed")
PUBLISH = Transition(("decoding",), "done")
DECODING_FAILED = Transition(("decoding",), "failed")


@dataclass(frozen=True)
class StudyRow:
    """One study; ``contributions`` (count), ``records`` (sum of n) and ``registered`` (roster
    size) are its totals, which a backend keeps equal to a recount of its rows, updated in the
    transaction that changes them (reading a study costs O(1) in its contributions).
    ``closing`` is the reason of a close waiting for the devices holding an input ticket (None
    if no close was requested); ``parent`` the study whose refinement round this is (None for a
    study an operator created); ``roster`` the most devices the roster takes (None:
    ``min_devices``); ``filled_at`` when (Unix seconds) the quorum had registered (None
    before)."""

    study_id: str
    spec_json: str
    spec_sha256: str
    state: str
    detail: str
    created_at: float
    deadline: float | None
    min_devices: int
    contributions: int
    records: float
    registered: int
    closing: str | None = None
    parent: str | None = None
    roster: int | None = None
    filled_at: float | None = None

    @property
    def capacity(self) -> int:
        """How many devices the roster takes."""
        return self.min_devices if self.roster is None else self.roster

    @property
    def roster_full(self) -> bool:
        """Whether the quorum has registered (a plain study then takes input, for good)."""
        return self.filled_at is not None

    def close_due(self, now: float, collect_seconds: float | None) -> str | None:
        """Why an accepting study should close at ``now`` (Unix seconds), or None: a close was
        requested, its whole roster has contributed (the submission that completed it closes it
        at once, unless its coordinator died first: a re-send is only a duplicate), its deadline
        passed, or ``collect_seconds`` (the spec's collection window) have passed since its
        quorum registered."""
        if self.closing is not None:
            return self.closing
        if self.contributions >= self.capacity:
            return "every roster device contributed"
        if self.deadline is not None and self.deadline <= now:
            return "deadline reached"
        if None not in (collect_seconds, self.filled_at) and self.filled_at + collect_seconds <= now:
            return f"collection window of {collect_seconds:g} s ended"
        return None


@dataclass(frozen=True)
class ContributionRow:
    """One device's sketch for one study, as received; ``kind`` is one of ``KINDS``."""

    study_id: str
    device_id: str
    n: float
    kind: str
    payload: bytes
    payload_sha256: str
    signature: bytes
    received_at: float
    #: the release's cost to the device (None: not counted), :mod:`.accounts`
    epsilon: float | None = None
    delta: float | None = None


@dataclass(frozen=True)
class StageMessageRow:
    """A device's message of a secure stage (proto ``Stage`` number), as received, and when."""

    stage: int
    device_id: str
    body: bytes
    received_at: float


@dataclass(frozen=True)
class SecureRoundRow:
    """A secure round's progress: the stage open since ``opened_at`` (Unix seconds); once it
    ended, ``ended``, its roster as ``members`` (device → whether its masked input is in the sum)
    and, if it unmasked, the sum ``total`` (int64 LE words) of ``devices`` declaring ``records``."""

    stage: int
    opened_at: float
    ended: bool = False
    total: bytes | None = None
    devices: int = 0
    records: float = 0.0
    members: dict[str, bool] | None = None


@dataclass(frozen=True)
class RosterEntry:
    """A device on a study's roster: its enrolled label, when it registered and when its
    contribution was stored (Unix seconds; None before)."""

    device_id: str
    label: str
    registered_at: float
    contributed_at: float | None


@dataclass(frozen=True)
class RefusalRow:
    """A device's report that it declined a study: one of ``REFUSAL_REASONS``, and when."""

    device_id: str
    label: str
    reason: str
    reported_at: float


class Store(ABC):
    """The coordinator's durable state: devices, enrollment tokens, studies, contributions,
    results and an audit log. Safe to call from several threads.

    Transactions: every method that writes does so in one transaction that is durable before it
    returns; a write that returned survives the coordinator being killed at any later point, and
    a write interrupted before it returned leaves no trace. A refusal (:class:`StoreError`) or a
    ``ValueError`` for a malformed argument writes nothing. Reads see every write that returned.
    Times are float Unix seconds (``time.time()``); tokens are kept only as SHA-256 digests.
    """

    #: Whether other coordinator processes may serve this store at the same time (a PostgreSQL
    #: database served with ``--shared``); a SQLite file has one coordinator.
    shared: bool = False

    @abstractmethod
    def close(self) -> None:
        """Release the backend; the store must not be used afterwards."""

    @abstractmethod
    def claim(self, key: str) -> AbstractContextManager[None]:
        """Hold the claim on ``key`` (the coordinator's: a study id, whose decoder steps it
        serializes, or a shared secure round's lock, ``secagg-round/`` and its id) for the ``with`` block,
        waiting while another thread or process holding the store has it; released when the
        block ends, or when the process holding it dies. Writes nothing."""

    @abstractmethod
    def claimed(self, key: str) -> bool:
        """Whether some thread or process holds (or, on SQLite, waits for) the claim on ``key``
        now; by the time it returns that may have changed."""

    # enrollment

    @abstractmethod
    def add_tokens(self, tokens: list[str]) -> None:
        """Store each (non-empty) token as usable once; re-adding a token, used or not, changes
        nothing. ValueError for an empty token. Audited."""

    @abstractmethod
    def enroll(self, token: str, public_key: bytes, label: str,
               budget: tuple[float, float] | None = None) -> str:
        """Atomically trade an unused token for a new device id bound to ``public_key`` and the
        total (ε, δ) ``budget`` it declares (None: none); return
        the id (``dev-`` and 16 hex digits). Idempotent: a token already traded for this very key
        returns the same id (the device's reply was lost; it stored its key before it asked).
        Audited.

        ValueError unless public_key is 32 bytes. StoreError 'permission_denied' for an unknown
        token or one traded for another key; 'conflict' if the key is already enrolled with
        another token (the token then stays unused).
        """

    @abstractmethod
    def account(self, device_id: str):
        """The device's :class:`~.accounts.Account`: its declared budget and what is counted
        against it; StoreError 'not_found' for an unknown device."""

    @abstractmethod
    def device_key(self, device_id: str) -> bytes | None:
        """The enrolled public key of ``device_id``, or None for an unknown device."""

    @abstractmethod
    def device_keys(self, limit: int) -> dict[str, bytes]:
        """The enrolled public keys of the ``limit`` devices enrolled last, by device id (what
        a coordinator keeps in memory at start, so that a Submit reads no key)."""

    # studies

    @abstractmethod
    def create_study(
        self, study_id: str, spec_json: str, spec_sha256: str, deadline: float | None, min_devices: int,
        parent: str | None = None, roster: int | None = None,
    ) -> StudyRow:
        """Create a study in state "open" and return it, a refinement round of ``parent`` if given,
        whose roster takes ``roster`` devices (None: ``min_devices``); StoreError 'conflict' if
        ``study_id`` exists, 'not_found' for an unknown parent. Audited."""

    @abstractmethod
    def rounds(self, parent: str) -> list[StudyRow]:
        """The refinement rounds of ``parent``, oldest first (empty if it has none)."""

    @abstractmethod
    def get_study(self, study_id: str) -> StudyRow:
        """The study ``study_id``; StoreError 'not_found' if there is none."""

    @abstractmethod
    def list_studies(self, states: tuple[str, ...] | None = None) -> list[StudyRow]:
        """All studies (or those whose state is in ``states``), oldest first (ties by id)."""

    @abstractmethod
    def set_state(
        self, study_id: str, state: str, detail: str = "", expect: tuple[str, ...] | None = None
    ) -> StudyRow:
        """Set a study's state and detail in one transaction and return the new row. Audited.

        With ``expect``, an atomic compare-and-set: StoreError 'failed_precondition' unless the
        current state is in ``expect`` (the coordinator always passes a :class:`Transition`'s
        sources); without it, unconditional. 'not_found' for an unknown study; ValueError for a
        state not in ``STATES``.
        """

    # rosters

    @abstractmethod
    def register(self, study_id: str, device_id: str,
                 cost: tuple[float, float] | None = None) -> tuple[bool, StudyRow]:
        """Add ``device_id`` to the study's roster in one transaction; (added, the study after);
        with its release's ``cost``, refused if that would take the device past its declared
        budget (:mod:`.accounts`: the contribution is checked again).

        Idempotent: (False, row) for a device already in the roster, whatever the study's state.
        The registration that brings the roster to ``min_devices`` sets ``filled_at``.
        StoreError: 'not_found' for an unknown study or device; 'failed_precondition' unless the
        study is in ``ACCEPTING`` and not closing, or if its roster already holds ``capacity``
        devices (it is never larger), or past the declared budget. Audited.
        """

    @abstractmethod
    def leave(self, study_id: str, device_id: str) -> tuple[bool, StudyRow]:
        """Take ``device_id`` off the study's roster in one transaction, freeing its place (the
        roster stays filled); (removed, the study after). Idempotent: (False, row) for a device
        not in the roster. StoreError: 'not_found' for an unknown study; 'failed_precondition'
        for a study not in ``ACCEPTING`` or a device that contributed to it; 'aborted' for one
        holding a live ticket (it may have spent: it may leave once the ticket ends). Audited."""

    @abstractmethod
    def ticket(self, study_id: str, device_id: str, seconds: float) -> float:
        """Give a roster device an input ticket: the coordinator's promise to take its
        contribution for ``seconds`` from now, even if a close is requested meanwhile. Returns
        ``seconds``, or 0.0 (nothing written) unless the study is accepting, not closing, its
        roster full and holding the device, and the device has not contributed yet."""

    @abstractmethod
    def memberships(self, device_id: str, study_ids: tuple[str, ...]) -> dict[str, bool]:
        """For each of ``study_ids`` whose roster holds ``device_id``: whether the device
        contributed to it (a contribution is only taken from a roster device, which cannot leave
        once it has contributed). Studies it is not in, unknown studies and an unknown device are
        absent. Read only; what decides which studies and results a device may read."""

    @abstractmethod
    def outstanding(self, study_id: str, now: float) -> int:
        """How many roster devices hold a ticket live at ``now`` and have not contributed."""

    @abstractmethod
    def request_close(self, study_id: str, reason: str) -> StudyRow:
        """Record that the study should close (``closing`` = reason, kept if already set; the
        detail says so) once no ticket is outstanding; no new ticket is given from now on. Audited.
        'failed_precondition' unless the study is in ``ACCEPTING``."""

    # contributions

    @abstractmethod
    def add_contribution(self, row: ContributionRow) -> bool:
        """Record a device's contribution, at most one per (study, device), in one transaction.

        Returns True if inserted (an "open" study makes its COLLECT transition in the same
        transaction), False for an idempotent re-send (same payload_sha256 and n as the stored
        one; nothing is written), even once the study has closed, so a device whose
        acknowledgement was lost learns that its bytes are stored. StoreError: 'not_found' for an
        unknown study or device; 'conflict' if the device already contributed different bytes;
        'failed_precondition' unless the study is in ``ACCEPTING`` and its roster is full, or
        if it is closing and the device holds no live ticket, or if the row's (ε, δ) would take
        the device past the total it declared (:mod:`.accounts`, checked in the same
        transaction); 'permission_denied' for a device not in the roster. ValueError for a kind not in
        ``KINDS``. Audited.
        """

    @abstractmethod
    def contribute(self, row: ContributionRow) -> tuple[bool, StudyRow | None]:
        """:meth:`add_contribution`, which returns its first element, and the study as the
        transaction that stored ``row`` left it (None for an identical re-send), so a caller
        needs no read of its own to see that the roster has all contributed."""

    @abstractmethod
    def contributions(self, study_id: str) -> list[ContributionRow]:
        """The study's contributions in order of arrival, ties by device id (empty for an unknown
        study)."""

    # results

    @abstractmethod
    def put_result(self, study_id: str, result_json: str) -> None:
        """Store a study's result and make its PUBLISH transition (detail cleared) in one
        transaction. Audited.

        StoreError 'not_found' for an unknown study; 'conflict' if it already has a result;
        'failed_precondition' unless it is decoding.
        """

    @abstractmethod
    def get_result(self, study_id: str) -> str | None:
        """The study's result JSON, or None if it has none (or does not exist)."""

    # audit log

    @abstractmethod
    def audit(self, actor: str, action: str, detail: str) -> None:
        """Append one row to the audit log."""

    @abstractmethod
    def audit_log(self, limit: int = 100,
                  study_ids: tuple[str, ...] = ()) -> list[tuple[float, str, str, str]]:
        """The newest ``limit`` audit rows as (at, actor, action, detail), newest last; with
        ``study_ids``, only rows whose detail names one of them."""

    # secure aggregation: a round's stage messages and progress, so a restart resumes it

    @abstractmethod
    def add_stage_message(self, study_id: str, stage: int, device_id: str, body: bytes,
                          cost: tuple[float, float] | None = None) -> bool:
        """Keep one stage message, one per (study, stage, device): True if stored; False for an
        identical re-send (nothing written, in any state); never replaced: StoreError 'conflict'
        for other bytes, 'not_found' for an unknown study or device, 'failed_precondition' unless
        the study is in ``ACCEPTING``, or (a REGISTER with its ``cost``) if the round would take
        the device past its declared budget (:mod:`.accounts`, in the same transaction). The
        round admits only its roster, the open stage and bounded bodies, so a study holds at
        most (stages × roster) rows of bounded size."""

    @abstractmethod
    def stage_messages(self, study_id: str, stages: tuple[int, ...] | None = None,
                       held: Collection[str] = ()) -> list[StageMessageRow]:
        """The study's kept stage messages, in order of arrival (ties by stage, then device id);
        empty for an unknown study or once its round ended. With ``stages``, only theirs, less
        the messages of ``stages[0]`` from the devices in ``held`` (a round catching up with the
        store reads only what it lacks: its open stage's new messages and any later stage's)."""

    @abstractmethod
    def open_stage(self, study_id: str, stage: int, opened_at: float) -> None:
        """Record in one transaction that the study's round has ``stage`` open since
        ``opened_at`` (replacing the stage recorded before). StoreError 'not_found' for an unknown
        study; 'failed_precondition' unless it is in ``ACCEPTING``."""

    @abstractmethod
    def secure_round(self, study_id: str) -> SecureRoundRow | None:
        """The study's round as :meth:`open_stage` and :meth:`end_secure_round` left it (stage 0
        if it ended before any was opened), or None if neither was called for it."""

    @abstractmethod
    def end_secure_round(self, study_id: str, detail: str, total: bytes | None = None,
                         devices: int = 0, records: float = 0.0,
                         members: dict[str, bool] | None = None) -> StudyRow:
        """End the study's round in one transaction and return the study: ``total`` (the unmasked
        sum) is kept with ``devices`` and ``records`` and the study makes its DECODE transition;
        without it, ABANDON; either way with ``detail`` and ``members``, and the stage messages
        are deleted (the progress row stays, ``ended``). StoreError 'not_found' for an unknown study,
        'failed_precondition' unless it is in ``ACCEPTING`` (nothing written). Audited."""

    # rule B: the abort statements of failed secure rounds (:mod:`.abort_statements`)

    @abstractmethod
    def add_abort_statement(self, study_id: str, device_id: str, audience: str,
                            signature: bytes, round_sha256: bytes = b"") -> bool:
        """Keep a device's (verified) abort statement of a round's instance ``round_sha256``,
        once per coordinator name ``audience``: True if stored, False if it had one. StoreError
        'not_found' for an unknown study, 'failed_precondition' unless it failed."""

    @abstractmethod
    def abort_statements(self, study_id: str) -> list:
        """The round's kept statements (``AbortStatementRow``), oldest first."""

    @abstractmethod
    def certify_abort(self, study_id: str, device_id: str) -> None:
        """Record that the device was handed a certificate of abort that suffices: the round no
        longer counts against its declared budget (:mod:`.accounts`)."""

    # what the operator watches

    @abstractmethod
    def add_refusal(self, study_id: str, device_id: str, reason: str) -> bool:
        """Record that ``device_id`` declined the study for ``reason`` (one of
        ``REFUSAL_REASONS``), in any state of the study; True if recorded, False if the device
        had reported a refusal of it already (the first is kept; nothing is written). StoreError
        'not_found' for an unknown study or device; ValueError for an unknown reason. Audited."""

    @abstractmethod
    def device_count(self) -> int:
        """How many devices are enrolled."""

    @abstractmethod
    def roster_entries(self, study_id: str, limit: int) -> list[RosterEntry]:
        """The first ``limit`` devices of the study's roster, in order of registration."""

    @abstractmethod
    def refusals(self, study_id: str, limit: int) -> tuple[list[RefusalRow], int]:
        """(the first ``limit`` refusals reported for the study, in order of report; how many
        were reported in all)."""

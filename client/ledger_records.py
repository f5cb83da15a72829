"""What a device's ledger holds and returns: budgets, log lines, spends, the identity, and the
ledger's refusals (an exceeded budget, a conflicting record) with the budget check's wording."""

from __future__ import annotations

import math
from dataclasses import dataclass

_MAX_NAME = 100


class BudgetExceeded(Exception):
    """Refusal: the spend would take a source past its budget. The message states what remains
    and what the study asks."""


class LedgerError(Exception):
    """A corrupt, foreign or newer-version ledger file, an unknown source, or a conflicting record."""


class LedgerUnavailable(LedgerError):
    """The ledger file could not be read or written (a full disk, a read-only or failing file
    system): nothing of the failed transaction was kept, so no spend was recorded and nothing
    was sent. ``str(exc)`` names the file and the cause."""


@dataclass(frozen=True)
class Budget:
    """A source's total budget: ε (dimensionless) and δ (a probability)."""

    epsilon: float
    delta: float


@dataclass(frozen=True)
class BudgetChange:
    """One line of the owner's log: when (Unix seconds), what, for which source, the new values."""

    at: float
    action: str
    source: str | None
    epsilon: float | None
    delta: float | None
    detail: str


@dataclass(frozen=True)
class Spend:
    """One recorded release: the study, the source it counts against, the privacy cost (ε, δ), the
    released record count ``n``, the exact payload bytes to (re-)send, when it was spent and
    acknowledged (Unix seconds), the study's final state once the device has learnt it, and for
    a refinement round the study it belongs to (``parent``) and its number (0: a sketch); on a
    release after which its study has more rounds, the study's whole ε for this device
    (``study_epsilon``: what it spent on the study before, this release, and the rounds to
    come) and until when (Unix seconds) the device keeps the rounds' share aside
    (``kept_until``); for a masked (secure-aggregation) release, the device's input before the
    masks (int64 words; None otherwise) and the round's terms it saw before its masked input
    left it (:class:`fedsketch.common.secagg.abort.RoundTerms` as bytes; None otherwise, and for
    spends recorded before ledger schema 9)."""

    study_id: str
    study_name: str
    source: str
    epsilon: float
    delta: float
    n: float
    kind: str
    payload: bytes
    payload_sha256: str
    spec_sha256: str
    spent_at: float
    acked_at: float | None
    receipt: str | None
    final_state: str | None
    parent: str | None = None
    round: int = 0
    study_epsilon: float | None = None
    premask: bytes | None = None
    kept_until: float | None = None
    round_terms: bytes | None = None


@dataclass(frozen=True)
class Identity:
    """The device's identity: its id, raw Ed25519 private key bytes and its coordinator's address."""

    device_id: str
    private_key: bytes
    coordinator: str


def check_budget(epsilon: float, delta: float) -> Budget:
    """A budget with ε finite and > 0 and δ in [0, 1); ValueError otherwise."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"a budget needs a finite ε > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError(f"a budget needs δ in [0, 1), got {delta!r}")
    return Budget(float(epsilon), float(delta))


#: Relative slack of :func:`fits` (float rounding of the spends; far below any ε one would ask).
BUDGET_SLACK = 1e-12


def fits(spent: float, asked: float, budget: float) -> bool:
    """Whether a spend of ``asked`` on top of ``spent`` stays within ``budget`` (ε or δ):
    spent + asked ≤ budget·(1 + 10⁻¹²), the sum taken exactly (math.fsum). The slack is relative,
    so a budget of 0 (a pure-ε device's δ) admits nothing above 0."""
    return asked <= 0 or math.fsum((spent, asked)) <= budget * (1.0 + BUDGET_SLACK)


def over_budget(source: str, budget: Budget, spent: tuple[float, float],
                set_aside: tuple[float, float], epsilon: float, delta: float) -> str | None:
    """Why a spend of (ε, δ) does not fit ``source``'s ``budget`` (:func:`fits`) on top of what it
    ``spent`` (ε, δ) and what is ``set_aside`` (ε, δ) for studies the device joined or whose
    rounds are still to come, or None."""
    for name, asked, total, used, held in (("ε", epsilon, budget.epsilon, spent[0], set_aside[0]),
                                           ("δ", delta, budget.delta, spent[1], set_aside[1])):
        taken = math.fsum((used, held))
        if not fits(taken, asked, total):
            return (f"insufficient budget: it asks {name} = {asked:g}, "
                    f"{max(0.0, total - taken):g} of {total:g} remains for source {source!r}"
                    + (f", with {held:g} set aside for studies it joined" if held > 0 else "")
                    + (" (a pure-ε budget)" if name == "δ" and total == 0 else ""))
    return None


def check_source(name: str) -> str:
    """A source name: 1 to 100 printable characters."""
    if not (isinstance(name, str) and 0 < len(name) <= _MAX_NAME and name.isprintable()):
        raise ValueError(f"a source name needs 1 to {_MAX_NAME} printable characters, got {name!r}")
    return name

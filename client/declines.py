"""Why a device declines a study, and telling the coordinator: a reason code only.

A refusal the device decides itself is a :class:`Declined`: its text goes to the device's own
log, its ``code`` (a ``RefusalReason`` of ``proto/fedsketch.proto``) to the coordinator, signed
(:func:`fedsketch.common.net.signing.refusal_digest`; sent by
:class:`~.roster_steps.RosterSteps`), once per study, so the operator sees why a
device is absent (``coordinator status``). A refusal of the coordinator's making (it refused a
registration, a ticket or a release) is a plain string and is not reported: the coordinator
knows.

What a code reveals. Every code but three depends on public things only: the spec, the owner's
policy, the device's budget. TOO_MANY_RECORDS (either relation), TOO_FEW_RECORDS (replace-one
only, where n is released exactly) and DATA_UNREADABLE (a value that is not finite) depend on
the records, and each says only the decision that the device's absence already shows: a bare
code, with no count, margin or value. Under add/remove, where n is private, the count refusal
reveals the one bit "n > max_device_records" that non-participation shows anyway (docs/operator-guide.md, "The
per-device record cap"); the count stops with the chunk that passes the cap
(:func:`~.localdata.count_records`), so the time a refusing device takes does not grow with how far
beyond the cap its n lies (but for a CSV file, whose rows are counted whenever it is opened, for
every study alike), and reports are sent together at the end of a pass, not the moment a count
ends.

A device sends a report at most once per study while it runs (a restart may send it again; the
coordinator keeps the first). A coordinator of an earlier release answers UNIMPLEMENTED: the
device gives up on that report, as it does after any final refusal; a transient error leaves it
for the next pass while the study is listed.
"""

from __future__ import annotations

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.study import StudySpec


class Declined(str):
    """A refusal the device decided: its text (for the device's log) and the ``RefusalReason``
    ``code`` it reports."""

    code: int

    def __new__(cls, text: str, code: int = pb.OTHER) -> Declined:
        made = super().__new__(cls, text)
        made.code = code
        return made


def out_of_range(spec: StudySpec, n: int) -> Declined | None:
    """Step 4: why the device cannot release n records: more than the study's per-device cap,
    or (replace-one only: n is public there) fewer than ``min_records``."""
    if n > spec.device_cap:
        return Declined(f"the study takes at most {spec.device_cap:,} records per device "
                        "(max_device_records), the device has more: it does not take part",
                        pb.TOO_MANY_RECORDS)
    if spec.sketch.privacy.neighbouring == "replace_one" and n < spec.min_records:
        return Declined(f"the study needs {spec.min_records} records, the device has {n}",
                        pb.TOO_FEW_RECORDS)
    return None

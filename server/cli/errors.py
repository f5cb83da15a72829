"""How the coordinator-side commands report an expected failure: :func:`fedsketch.common.cli.clean_errors`
with the store's and the ledger's refusals among the expected ones (the simulator drives ledgers)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from fedsketch.client.ledger import LedgerError
from fedsketch.common.cli import clean_errors as _clean_errors
from fedsketch.server.store import StoreError


def clean_errors(*extra: type[BaseException]) -> AbstractContextManager[None]:
    """``error: <first line>`` and exit status 1 for bad input, a store or ledger refusal, a
    refused gRPC call, and ``extra``."""
    return _clean_errors(StoreError, LedgerError, *extra)

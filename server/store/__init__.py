"""The coordinator's durable state: studies, devices, contributions, results and the audit log,
behind the :class:`Store` interface (:mod:`.base`); every acknowledged message is committed before
the reply. :func:`open_store` picks the backend from a path or URL: SQLite (WAL) today."""

from __future__ import annotations

import os
import re

from fedsketch.server.store.base import ContributionRow, Store, StoreError, StudyRow
from fedsketch.server.store.sqlite import SQLiteStore

__all__ = ["ContributionRow", "SQLiteStore", "Store", "StoreError", "StudyRow", "open_store"]

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)", re.DOTALL)


def open_store(url_or_path: str | os.PathLike) -> Store:
    """Open (or create) the store at ``url_or_path``.

    A path-like object, or a string without ``scheme://``, is a SQLite file. URLs follow
    SQLAlchemy's spelling, so the PostgreSQL backend to come takes the URLs operators already
    write: ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db``. Any other scheme, or a
    SQLite URL with a host or without a path, is a ValueError; the backend's own refusals
    (:class:`StoreError`) pass through.
    """
    if not isinstance(url_or_path, str):
        return SQLiteStore(url_or_path)
    url = _URL.fullmatch(url_or_path)
    if url is None:
        return SQLiteStore(url_or_path)
    if url["scheme"].lower() != "sqlite":
        raise ValueError(f"unsupported store URL {url_or_path!r}: this fedsketch stores only in SQLite "
                         "(a file path, or sqlite:///relative.db, or sqlite:////absolute/path.db)")
    host, slash, path = url["rest"].partition("/")
    if host or not slash or not path:
        raise ValueError(f"bad SQLite store URL {url_or_path!r}: write sqlite:///relative.db or "
                         "sqlite:////absolute/path.db")
    return SQLiteStore(path)

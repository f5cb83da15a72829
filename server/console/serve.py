"""What ``coordinator serve`` starts of the console: the health service always, the metrics
(``--metrics``) and the web page (``--console``) when asked. :class:`Console` is made before the
gRPC server (it wraps the store and gives the interceptors and the health service) and started
once the coordinator exists."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.store.base import Store

log = logging.getLogger("fedsketch.coordinator")


class Console:
    """The console of one coordinator process."""

    @staticmethod
    def check(metrics_listen: str | None, console_listen: str | None) -> None:
        """ValueError for an address that is not HOST:PORT (before the store is opened)."""
        from fedsketch.server.console.metrics import split_listen

        for option, listen in (("--metrics", metrics_listen), ("--console", console_listen)):
            if listen is not None:
                split_listen(listen, option)

    def __init__(self, store: Store, metrics_listen: str | None, console_listen: str | None) -> None:
        from fedsketch.server.console.health import StoreHealth

        self.check(metrics_listen, console_listen)
        self.store, self.interceptors, self.metrics = store, [], None
        self._metrics_listen, self._console_listen = metrics_listen, console_listen
        self._stops: list[Callable[[], None]] = []
        if metrics_listen is not None:
            from prometheus_client import CollectorRegistry

            from fedsketch.server.console.instrument import MeteredStore, RpcMetrics
            from fedsketch.server.console.metrics import Metrics, StoreGauges

            registry = CollectorRegistry()
            self.metrics = Metrics(registry)
            registry.register(StoreGauges(store))
            self.store = MeteredStore(store, self.metrics)
            self.interceptors = [RpcMetrics(self.metrics)]
        self.health = StoreHealth(store, self._healthy)

    def _healthy(self, serving: bool) -> None:
        if self.metrics is not None:
            self.metrics.store_healthy.set(1 if serving else 0)

    def start(self, coordinator: Coordinator, token_sha256: str, tls: tuple[Path, Path] | None) -> None:
        """Start the metrics listener and the web page, as asked (OSError if a port is taken)."""
        if self.metrics is not None:
            from fedsketch.server.console.metrics import serve_metrics

            port, stop = _bound("--metrics", self._metrics_listen, serve_metrics,
                                self._metrics_listen, self.metrics.registry)
            self._stops.append(stop)
            log.info("metrics on http://%s:%d/metrics", self._metrics_listen.rpartition(":")[0], port)
        if self._console_listen is not None:
            from fedsketch.server.console.page import serve_console

            port, stop = _bound("--console", self._console_listen, serve_console,
                                self._console_listen, coordinator, token_sha256, tls)
            self._stops.append(stop)
            log.info("console on %s://%s:%d/", "http" if tls is None else "https",
                     self._console_listen.rpartition(":")[0], port)

    def stop(self) -> None:
        for stop in reversed(self._stops):
            stop()


def _bound(option: str, listen: str, start: Callable, *args) -> tuple[int, Callable[[], None]]:
    """``start(*args)``; an address that cannot be bound is an OSError naming ``option``."""
    try:
        return start(*args)
    except OSError as exc:
        raise OSError(f"{option} {listen}: cannot listen there ({exc.strerror or exc})") from None

"""The coordinator's Prometheus metrics, exposed with ``prometheus-client`` on their own HTTP
listener (``coordinator serve --metrics HOST:PORT``, path ``/metrics``).

Two kinds, each in its own registry-bound object so that a process (or a test) may hold several:

- **process metrics**, counted by this coordinator as it works (:class:`Metrics`; the store
  wrapper :class:`~.instrument.MeteredStore` and the gRPC interceptor
  :class:`~.instrument.RpcMetrics` feed them). Coordinators sharing a database (``--shared``)
  each count their own calls and writes; sum them in Prometheus.
- **store-derived gauges**, read from the store at each scrape (:class:`StoreGauges`): studies by
  state and devices enrolled. Shared coordinators expose the same values (take ``max``).

Label values come from closed sets only — RPC method names of the proto, gRPC status code names,
payload kinds (:data:`~fedsketch.server.store.base.KINDS`), refusal reasons
(:data:`~fedsketch.server.store.base.REFUSAL_REASONS`), study states, secure stage names and the
store's method names — never a device id, study id, label or anything else a client chooses.
Times are seconds.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fedsketch.server.store.base import STATES, Store

#: Buckets (seconds) of the RPC and store latency histograms: 1 ms to 30 s.
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Buckets (seconds) of secure stages and decodings: 10 ms to 2 h.
SLOW_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 7200.0)


class Metrics:
    """What one coordinator process counts (module docstring); every name is exposed with the
    ``fedsketch_`` prefix, counters with ``_total``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rpcs = Counter("fedsketch_rpcs", "gRPC calls answered, by method (Service/Method) and "
                            "status code.", ["method", "code"], registry=registry)
        self.rpc_seconds = Histogram("fedsketch_rpc_seconds", "Seconds to answer a gRPC call, by "
                                     "method.", ["method"], buckets=FAST_BUCKETS, registry=registry)
        self.contributions = Counter("fedsketch_contributions", "Contributions stored (re-sends "
                                     "not counted), by payload kind.", ["kind"], registry=registry)
        self.stage_messages = Counter("fedsketch_secure_messages", "Secure-aggregation stage "
                                      "messages stored, by stage.", ["stage"], registry=registry)
        self.refusals = Counter("fedsketch_refusals", "Refusals devices reported, by reason.",
                                ["reason"], registry=registry)
        self.stage_seconds = Histogram("fedsketch_secure_stage_seconds", "Seconds a secure-"
                                       "aggregation stage stayed open (from its opening to the next "
                                       "stage's or the round's end), by stage.", ["stage"],
                                       buckets=SLOW_BUCKETS, registry=registry)
        self.dropouts = Counter("fedsketch_secure_dropouts", "Devices that sent the stage before "
                                "but not this one when it closed, by stage.", ["stage"],
                                registry=registry)
        self.decode_seconds = Histogram("fedsketch_decode_seconds", "Seconds from a study's move "
                                        "to decoding to its result or failure, as this coordinator "
                                        "saw both (a study with refinement rounds: all its rounds).",
                                        buckets=SLOW_BUCKETS, registry=registry)
        self.store_seconds = Histogram("fedsketch_store_seconds", "Seconds a store call took, by "
                                       "operation (the store's method).", ["operation"],
                                       buckets=FAST_BUCKETS, registry=registry)
        self.store_errors = Counter("fedsketch_store_errors", "Store calls that failed with an "
                                    "error other than a refusal, by operation.", ["operation"],
                                    registry=registry)
        self.store_healthy = Gauge("fedsketch_store_healthy", "1 while the health probe finds the "
                                   "store answering (the gRPC health service says SERVING), else 0.",
                                   registry=registry)


class StoreGauges(Collector):
    """Gauges read from the store at each scrape: ``fedsketch_studies{state}`` (studies and
    refinement rounds) and ``fedsketch_devices_enrolled``. A scrape while the store does not
    answer leaves them out (its absence is what the alert on ``fedsketch_store_healthy`` sees)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list:
        return [GaugeMetricFamily("fedsketch_studies", "Studies by state.", labels=["state"]),
                GaugeMetricFamily("fedsketch_devices_enrolled", "Devices enrolled.")]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            states = Tally(row.state for row in self.store.list_studies())
            devices = self.store.device_count()
        except Exception:  # noqa: BLE001 - a sick store: the scrape still answers, without these
            return
        studies = GaugeMetricFamily("fedsketch_studies", "Studies by state.", labels=["state"])
        for state in STATES:
            studies.add_metric([state], states.get(state, 0))
        yield studies
        yield GaugeMetricFamily("fedsketch_devices_enrolled", "Devices enrolled.", value=devices)


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry exposes (``fedsketch_rpcs_total``, ``…_bucket``, …)."""
    return {s.name for family in registry.collect() for s in family.samples} | {
        family.name for family in registry.collect()}


def serve_metrics(listen: str, registry: CollectorRegistry) -> tuple[int, Callable[[], None]]:
    """Serve ``registry`` at http://``listen``/metrics (port 0: any free one) on a thread of its
    own; returns (bound port, the function that stops it). OSError if ``listen`` cannot be bound."""
    host, port = split_listen(listen, "--metrics")
    server, thread = start_http_server(port, host, registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return server.server_port, stop


def split_listen(listen: str, option: str, allow_zero: bool = True) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (port 0: any free one, if ``allow_zero``); ValueError naming
    ``option`` otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not int(port) < 65536 or (
            int(port) == 0 and not allow_zero):
        raise ValueError(f"{option} {listen!r}: give HOST:PORT, e.g. 127.0.0.1:9464")
    return host.strip("[]"), int(port)

"""The coordinator's Prometheus metrics, exposed with ``prometheus-client`` on their own HTTP
listener (``coordinator serve --metrics HOST:PORT``, path ``/metrics``).

Two kinds, each in its own registry-bound object so that a process (or a test) may hold several:

- **process metrics**, counted by this coordinator as it works (:class:`Metrics`; the store
  wrapper :class:`~.instrument.MeteredStore` and the gRPC interceptor
  :class:`~.instrument.RpcMetrics` feed them). Coordinators sharing a database (``--shared``)
  each count their own calls and writes; sum them in Prometheus.
- **store-derived gauges**, read from the store at each scrape (:class:`StoreGauges`): studies by
  state, devices enrolled and studies overdue. Shared coordinators expose the same values (take ``max``).

Label values come from closed sets only — RPC method names of the proto, gRPC status code names,
payload kinds (:data:`~fedsketch.server.store.base.KINDS`), refusal reasons
(:data:`~fedsketch.server.store.base.REFUSAL_REASONS`), study states, secure stage names and the
store's method names — never a device id, study id, label or anything else a client chooses.
Times are seconds.
"""

from __future__ import annotations

import json
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fedsketch.server.store.base import ACCEPTING, STATES, Store

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


#: What each store-derived gauge says.
STUDIES_HELP = "Studies and refinement rounds, by state."
DEVICES_HELP = "Devices enrolled."
OVERDUE_HELP = ("Accepting plain studies that should have closed by now (a close requested, the roster "
                "complete, the deadline or the collection window past): the coordinators close "
                "them within a second, so one that stays is stuck.")


class StoreGauges(Collector):
    """Gauges read from the store at each scrape: ``fedsketch_studies{state}``,
    ``fedsketch_devices_enrolled`` and ``fedsketch_studies_overdue`` (by
    :meth:`~fedsketch.server.store.base.StudyRow.close_due`, the rule the deadline watcher
    applies). A scrape while the store does not answer leaves them out (the alert on
    ``fedsketch_store_healthy`` covers that)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list:
        return [GaugeMetricFamily("fedsketch_studies", STUDIES_HELP, labels=["state"]),
                GaugeMetricFamily("fedsketch_devices_enrolled", DEVICES_HELP),
                GaugeMetricFamily("fedsketch_studies_overdue", OVERDUE_HELP)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.time()
        try:
            rows = self.store.list_studies()
            devices = self.store.device_count()
        except Exception:  # noqa: BLE001 - a sick store: the scrape still answers, without these
            return
        states = Tally(row.state for row in rows)
        overdue = 0
        for row in (r for r in rows if r.state in ACCEPTING):
            spec = json.loads(row.spec_json)  # a secure round closes by its stages' timeouts
            if spec.get("secure_aggregation") is None and row.close_due(
                    now, spec.get("collect_seconds")) is not None:
                overdue += 1
        studies = GaugeMetricFamily("fedsketch_studies", STUDIES_HELP, labels=["state"])
        for state in STATES:
            studies.add_metric([state], states.get(state, 0))
        yield studies
        yield GaugeMetricFamily("fedsketch_devices_enrolled", DEVICES_HELP, value=devices)
        yield GaugeMetricFamily("fedsketch_studies_overdue", OVERDUE_HELP, value=overdue)


#: The series names a metric family of each type is exposed as (Prometheus text format).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry exposes (``fedsketch_rpcs_total``, ``…_bucket``, …),
    whether or not a labelled metric has a sample yet."""
    return {family.name + suffix for family in registry.collect()
            for suffix in SUFFIXES.get(family.type, ("",))}


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

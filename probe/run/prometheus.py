"""The Prometheus endpoint of a capture: every counter of probe.stats per worker, and whether each worker runs."""

from probe.errors import ConfigError
from probe.stats import COUNTERS


def serve_prometheus(supervisor):
    """Serve the supervisor's counters, per worker, on capture.prometheus_port (0: not at all)."""
    port = supervisor.cfg.capture.prometheus_port
    if not port:
        return
    from prometheus_client import start_http_server  # only when asked for: start-up of every command
    from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self):
            with supervisor.lock:
                per_worker = [(s.worker_id, s.counters(), s.proc is not None) for s in supervisor.slots]
            for name, meaning in COUNTERS:
                fam = CounterMetricFamily(f"dnsprobe_{name}", meaning, labels=["worker"])
                for wid, counters, _ in per_worker:
                    fam.add_metric([str(wid)], getattr(counters, name))
                yield fam
            alive = GaugeMetricFamily("dnsprobe_worker_up", "1 when the capture worker runs", labels=["worker"])
            for wid, _, up in per_worker:
                alive.add_metric([str(wid)], 1 if up else 0)
            yield alive

    registry = CollectorRegistry(auto_describe=True)
    registry.register(Collector())
    try:
        start_http_server(port, addr=supervisor.cfg.capture.prometheus_address, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"config key 'capture.prometheus_port': cannot listen on "
            f"{supervisor.cfg.capture.prometheus_address}:{port}: {exc.strerror}"
        ) from None

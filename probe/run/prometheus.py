"""The Prometheus endpoint of a capture (capture.prometheus_port; 0: off).

- every counter of probe.stats that applies to the capture's source, per worker: dnsprobe_<counter>_total
  {worker} (no DPDK series under AF_PACKET, no kernel series under DPDK); the kernel's counters per interface
  too: dnsprobe_kernel_received_total{worker, interface}, and dnsprobe_interface_up{worker, interface}; the
  export.on_close counters are the supervisor's: dnsprobe_on_close_commands_total, without a worker;
- what was written, over all workers: dnsprobe_dns_transactions_total{rcode, qtype, transport} (rcode "none":
  no response; qtype "none": no question; RCODEs and QTYPEs without a mnemonic are "other"; transport as the
  files' transport column: udp, tcp, dot, doh, ...) and the histogram dnsprobe_dns_response_delay_seconds;
- dnsprobe_worker_up{worker}, dnsprobe_build_info{version, python, parser}, and per process (the supervisor and
  each worker) dnsprobe_process_cpu_seconds_total and dnsprobe_process_resident_memory_bytes.
"""

import os
import platform

from probe.errors import ConfigError
from probe.stats import COUNTERS, RUN_COUNTERS, SOCKET_COUNTERS, Stats, applicable


def _labels(key):
    from probe.decode.mnemonics import RCODES, RR_TYPES

    rcode, qtype, transport = key
    return [
        "none" if rcode is None else RCODES.get(rcode, "other"),
        "none" if qtype is None else RR_TYPES.get(qtype, "other"),
        transport or "unknown",
    ]


def dns_totals(supervisor):
    """The DNS metrics of every worker process of the capture, summed (export.metrics.DnsMetrics)."""
    from export.metrics import DnsMetrics

    total = DnsMetrics()
    with supervisor.lock:
        docs = [s.retired_dns for s in supervisor.slots] + [(s.snapshot or {}).get("dns") for s in supervisor.slots]
    for doc in docs:
        if doc is not None:
            total.add_dict(doc)
    return total


def serve_prometheus(supervisor):
    """Serve the supervisor's figures on capture.prometheus_port (0: not at all)."""
    port = supervisor.cfg.capture.prometheus_port
    if not port:
        return
    from prometheus_client import start_http_server  # only when asked for: start-up of every command
    from prometheus_client.core import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(supervisor))
    try:
        start_http_server(port, addr=supervisor.cfg.capture.prometheus_address, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"config key 'capture.prometheus_port': cannot listen on "
            f"{supervisor.cfg.capture.prometheus_address}:{port}: {exc.strerror}"
        ) from None


class _Collector:
    """The metric families of the capture, made afresh at every scrape."""

    def __init__(self, supervisor):
        from probe import __version__
        from probe.decode.parsers import effective

        self.supervisor = supervisor
        self.counters = [(name, meaning) for name, meaning in COUNTERS if name in applicable(supervisor.source)]
        self.build = {"version": __version__, "python": platform.python_version(),
                      "parser": effective(supervisor.cfg.decode.parser)}

    def collect(self):
        supervisor = self.supervisor
        with supervisor.lock:
            per_worker = [(str(s.worker_id), s.counters(), s.interfaces(), s.proc is not None)
                          for s in supervisor.slots]
        yield from self._counters(per_worker)
        yield from self._states(per_worker)
        yield from _dns_families(dns_totals(supervisor))
        from prometheus_client.core import GaugeMetricFamily

        info = GaugeMetricFamily("dnsprobe_build_info", "dnsprobe's version, Python's, and the DNS parser that"
                                 " runs", labels=list(self.build))
        info.add_metric(list(self.build.values()), 1)
        yield info
        yield from self._processes()

    def _counters(self, per_worker):
        """A counter family per counter: the supervisor's, per worker and interface, or per worker."""
        from prometheus_client.core import CounterMetricFamily

        run = Stats()
        self.supervisor.on_close.count(run)
        for name, meaning in self.counters:
            if name in RUN_COUNTERS:  # the supervisor's, not a worker's
                fam = CounterMetricFamily(f"dnsprobe_{name}", meaning)
                fam.add_metric([], getattr(run, name))
            elif name in SOCKET_COUNTERS:
                fam = CounterMetricFamily(f"dnsprobe_{name}", meaning, labels=["worker", "interface"])
                for wid, _, interfaces, _ in per_worker:
                    for ifname, values in interfaces.items():
                        fam.add_metric([wid, ifname], values.get(name, 0))
            else:
                fam = CounterMetricFamily(f"dnsprobe_{name}", meaning, labels=["worker"])
                for wid, totals, _, _ in per_worker:
                    fam.add_metric([wid], getattr(totals, name))
            yield fam

    def _states(self, per_worker):
        """dnsprobe_worker_up, and under AF_PACKET dnsprobe_interface_up."""
        from prometheus_client.core import GaugeMetricFamily

        alive = GaugeMetricFamily("dnsprobe_worker_up", "1 when the capture worker runs", labels=["worker"])
        link = GaugeMetricFamily("dnsprobe_interface_up", "1 while the worker captures on the interface (0: down"
                                 " or waited for)", labels=["worker", "interface"])
        for wid, _, interfaces, up in per_worker:
            alive.add_metric([wid], 1 if up else 0)
            for ifname, values in interfaces.items():
                if "state" in values:
                    link.add_metric([wid, ifname], 1 if up and values["state"] == "capturing" else 0)
        yield alive
        if self.supervisor.source == "af_packet":
            yield link

    def _processes(self):
        """CPU time and resident memory of the supervisor and of each worker process."""
        import psutil
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self.supervisor.lock:
            workers = [(str(s.worker_id), s.pid) for s in self.supervisor.slots if s.proc is not None]
        processes = [(("supervisor", ""), os.getpid())] + [(("worker", wid), pid) for wid, pid in workers]
        cpu = CounterMetricFamily("dnsprobe_process_cpu_seconds", "user and system CPU time of the process",
                                  labels=["process", "worker"])
        rss = GaugeMetricFamily("dnsprobe_process_resident_memory_bytes", "resident memory of the process",
                                labels=["process", "worker"])
        for labels, pid in processes:
            try:
                proc = psutil.Process(pid)
                times, memory = proc.cpu_times(), proc.memory_info()
            except psutil.Error:  # it ended meanwhile
                continue
            cpu.add_metric(list(labels), times.user + times.system)
            rss.add_metric(list(labels), memory.rss)
        yield cpu
        yield rss


def _dns_families(dns):
    """dnsprobe_dns_transactions and the response delay histogram of the summed DNS metrics."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    from export.metrics import DELAY_BUCKETS_S

    fam = CounterMetricFamily("dnsprobe_dns_transactions", "transactions written, by response RCODE ('none':"
                              " no response), QTYPE and transport", labels=["rcode", "qtype", "transport"])
    merged = {}
    for key, n in dns.transactions.items():
        labels = tuple(_labels(key))
        merged[labels] = merged.get(labels, 0) + n
    for labels, n in sorted(merged.items()):
        fam.add_metric(list(labels), n)
    yield fam
    buckets = [(str(b), n) for b, n in zip(DELAY_BUCKETS_S, dns.delay_le)] + [("+Inf", dns.delay_count)]
    yield HistogramMetricFamily("dnsprobe_dns_response_delay_seconds", "response capture time minus query"
                                " capture time, of the transactions written with both",
                                buckets=buckets, sum_value=dns.delay_sum_us / 1e6)

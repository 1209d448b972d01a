"""One worker position of a live capture's supervisor (probe/run/supervisor.py): its worker id and core, the process
that runs there now, and the counters, interface figures and file names of the processes that ran there before
(a worker that dies is restarted in the same slot)."""

import collections

from probe.run.durability import KEEP_FILE_NAMES
from probe.stats import COUNTER_NAMES, Stats


def _count(value):
    return isinstance(value, int) and not isinstance(value, bool)


class WorkerSlot:
    """One worker position (worker id, core); its process changes when it is restarted."""

    def __init__(self, worker_id, core):
        self.worker_id = worker_id
        self.core = core
        self.proc = None
        self.conn = None
        self.pid = None
        self.started = 0.0
        self.ready = False
        self.finished = False  # sent its final snapshot after a stop
        self.snapshot = None  # latest snapshot of the current process
        self.retired = Stats()  # counters of earlier processes of this slot
        self.restarts = 0
        self.quick_deaths = 0
        self.restart_at = None
        self.error = None
        self.lost = 0  # lost_in_dead_worker of the slot's dead processes
        self.files = collections.deque(maxlen=KEEP_FILE_NAMES)  # names of the files its processes completed
        self.retired_interfaces = {}  # interface → kernel counters of the slot's earlier processes
        self.retired_dns = None  # DNS metrics (export.metrics.DnsMetrics.as_dict()) of its earlier processes
        self.drained = False  # a leader that was told to stop has read its source and finished its pipeline
        self.parked = False  # a follower stopped because its leader died: it starts again after it
        self.group = ""  # the group its current process belongs to (led groups)

    def counters(self):
        total = Stats()
        total.add(self.retired)
        if self.snapshot:
            for name, value in self.snapshot["counters"].items():
                if name in COUNTER_NAMES:
                    setattr(total, name, getattr(total, name) + value)
        total.worker_restarts = self.restarts
        total.lost_in_dead_worker = self.lost
        return total

    def interfaces(self):
        """Per interface, its kernel counters over the slot's processes, and its state in the current one."""
        out = {name: dict(values) for name, values in self.retired_interfaces.items()}
        for name, values in ((self.snapshot or {}).get("interfaces") or {}).items():
            mine = out.setdefault(name, {})
            for key, value in values.items():
                mine[key] = mine.get(key, 0) + value if _count(value) else value
        return out

    def retire(self):
        """The current process is gone: keep its counters with the slot's."""
        self.retired = self.counters()
        self.retired.worker_restarts = self.retired.lost_in_dead_worker = 0
        self.retired_interfaces = {
            name: {k: v for k, v in values.items() if _count(v)} for name, values in self.interfaces().items()
        }
        dns = (self.snapshot or {}).get("dns")
        if dns is not None:
            if self.retired_dns is None:
                self.retired_dns = dns
            else:
                from export.metrics import DnsMetrics

                total = DnsMetrics()
                total.add_dict(self.retired_dns)
                total.add_dict(dns)
                self.retired_dns = total.as_dict()
        self.snapshot = None

"""What a live capture tells: the statistics JSON document, the status line on a terminal and the line it ends with,
from the supervisor's worker slots (probe/run/supervisor.py, probe/run/slot.py)."""

import datetime
import os
import time
from pathlib import Path

from probe.decode.parsers import effective as effective_parser
from probe.run.durability import KEEP_FILE_NAMES
from probe.run.log import StatusLine


def files_written(supervisor):
    """Names of the files completed (by the workers, and recovered), the last KEEP_FILE_NAMES of them."""
    with supervisor.lock:
        names = [name for slot in supervisor.slots for name in slot.files]
    names += [Path(path).name for path, _ in supervisor.recoveries.files]
    return sorted(names)[-KEEP_FILE_NAMES:]


def stats_doc(supervisor, running):
    """The statistics JSON document besides the counters: the run, each worker, the files, the errors."""
    with supervisor.lock:
        workers = {
            str(s.worker_id): {
                "core": s.core,
                "pid": s.pid,
                "alive": s.proc is not None,
                "restarts": s.restarts,
                "counters": s.counters().as_dict(),
                "interfaces": s.interfaces(),
                "part_file": (s.snapshot or {}).get("part_file"),
                "live_files": [Path(f).name for f in (s.snapshot or {}).get("live_files") or ()],
            }
            for s in supervisor.slots
        }
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "running": running,
        "pid": os.getpid(),
        "started": datetime.datetime.fromtimestamp(supervisor.started, datetime.timezone.utc).isoformat(),
        "updated": now.isoformat(),
        "interfaces": list(supervisor.interfaces),
        "dnstap": supervisor.dnstap,
        "coremask": supervisor.cfg.capture.coremask,
        "fanout_groups": dict(zip(supervisor.interfaces, supervisor.fanout_ids, strict=True)),
        "ip_filter": supervisor.ip_filter_where,
        "decode_parser": effective_parser(supervisor.cfg.decode.parser),  # auto resolved: fast or wire
        "workers": workers,
        "files_written": files_written(supervisor),
        "recovered_files": [{"file": Path(path).name, "records": n} for path, n in supervisor.recoveries.files],
        "errors": list(supervisor.errors) + list(supervisor.recoveries.errors),
    }


def status_line(supervisor, last):
    """Show the status line; last: (monotonic time, frames) of the previous one, for the rate; returns this one's."""
    total = supervisor.totals()
    now = time.monotonic()
    count = total.packets + total.dnstap_frames  # frames of either kind, for the rate
    rate = (count - last[1]) / max(now - last[0], 1e-6) if last else 0.0
    alive = sum(1 for s in supervisor.slots if s.proc is not None)
    parts = [f"{int(time.time() - supervisor.started)}s"]
    if supervisor.interfaces:
        parts.append(f"packets {total.packets:,}")
    if supervisor.dnstap:
        producers = total.dnstap_connections - total.dnstap_disconnections
        parts.append(f"dnstap messages {total.dnstap_frames:,} from {producers} producer(s)")
    parts.append(f"({rate:,.0f}/s)")
    parts.append(f"records in files {total.records:,}  files {total.files:,}")
    if supervisor.interfaces:
        parts.append(f"kernel drops {total.kernel_drops:,}")
    if supervisor.dnstap:
        errors = total.dnstap_frame_errors + total.dnstap_decode_errors + total.dnstap_truncated
        parts.append(f"dnstap errors {errors:,}")
    parts.append(f"workers {alive}/{len(supervisor.slots)}")
    if total.lost_in_dead_worker:
        parts.append(f"lost {total.lost_in_dead_worker:,}")
    StatusLine.show("  ".join(parts))
    return (now, count)


def summary(supervisor, total):
    """The line a stopped capture ends with (also with -q)."""
    took = int(time.time() - supervisor.started)
    what = [f"{total.packets:,} packets"] if supervisor.interfaces else []
    what += [f"{total.dnstap_frames:,} dnstap messages"] if supervisor.dnstap else []
    line = (f"stopped ({supervisor.stop_requested}) after {took // 3600}h{took // 60 % 60:02d}m{took % 60:02d}s: "
            f"{', '.join(what)}, {total.records:,} records in {total.files:,} file(s)")
    if supervisor.source == "af_packet" and supervisor.interfaces:
        line += f", kernel drops {total.kernel_drops:,}, capture interruptions {total.capture_interruptions:,}"
        if total.join_overlap:
            line += f", set aside at fanout joins {total.join_overlap:,} (join_overlap)"
    line += f", worker restarts {total.worker_restarts:,}, lost in dead workers {total.lost_in_dead_worker:,}"
    if supervisor.stats_path is not None:
        line += f"; statistics: {supervisor.stats_path}"
    return line

"""Files a writer left unfinished because its process died, made into finished files.

A file being written is locked by its writer (export.base.lock_live_file) until it is finished; the kernel
releases the lock when the process ends, however it ends. So a live file whose lock can be taken belongs to no
one: a Parquet journal (NAME.parquet.journal, export.parquet.journal) is converted into NAME.parquet, and a C-DNS
file (NAME.cdns[.gz|.xz|.zst].part) is given its complete blocks and its end (export.cdns.recover). One without
a complete batch or block held nothing its writer had flushed, and is removed. Files of other runs still
writing into the same directory stay locked and are left alone.
"""

import os
import time
from pathlib import Path

from export.base import announce_finished, lock_live_file

# Patterns of live files (a Parquet journal may be hidden: .NAME.parquet.journal in the hive layout).
LIVE_PATTERNS = ("*.parquet.journal", "*.cdns.part", "*.cdns.*.part")
# A live file is created empty, then locked by its writer: an empty one this young may be in between.
EMPTY_GRACE_S = 60.0


def orphans(directories, recursive=False):
    """Live files in the directories (and below them, recursive: a hive layout's partitions) that no process is
    writing: [(path, final path, lock descriptor)]. The caller holds the locks until it has finished the files
    (and closes the descriptors)."""
    from export.parquet.journal import final_of

    found = []
    seen = set()
    for directory in directories:
        for pattern in LIVE_PATTERNS:
            paths = Path(directory).rglob(pattern) if recursive else Path(directory).glob(pattern)
            for path in sorted(paths):
                if path in seen:
                    continue
                seen.add(path)
                try:
                    st = path.stat()
                    if not st.st_size and time.time() - st.st_mtime < EMPTY_GRACE_S:
                        continue
                    fd = lock_live_file(path)
                except OSError:  # locked: its writer is alive; or gone since we looked
                    continue
                if not path.exists():  # finished by its owner between the listing and the lock
                    os.close(fd)
                    continue
                final = final_of(path) if path.name.endswith(".journal") else path.with_name(path.name[: -len(".part")])
                found.append((path, final, fd))
    return found


def recover(directories, export_cfg, recursive=False):
    """Finish every orphaned live file of the directories (recursive: and below them); returns ([(finished path,
    records)], [error text])."""
    from export.cdns.recover import recover_cdns
    from export.parquet.journal import convert_journal

    done, errors = [], []
    for path, final, fd in orphans(directories, recursive):
        try:
            if path.name.endswith(".journal"):
                records = convert_journal(path, final, export_cfg)
            else:
                records = recover_cdns(path, final)
            if records:
                done.append((final, records))
                announce_finished(final)
        except OSError as exc:
            errors.append(f"{path}: cannot recover: {exc}")
        finally:
            os.close(fd)
    return done, errors

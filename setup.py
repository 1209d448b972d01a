"""Build the C extensions. Each one sits beside its Python twin, in the stage it belongs to; probe/native.py
lists them (EXTENSIONS) and loads them. The DPDK one is built only where pkg-config finds libdpdk.

Everything else about the package is in pyproject.toml. Every extension is optional=True: a machine without
a compiler (or without libdpdk) still installs the package, which then runs the Python twins and says so
(`dnsprobe capture --dpdk` says that DPDK support was not built); the tests require them all.
"""

import copy
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

INCLUDE = "include"  # C headers shared by several extensions, and the units some of them declare
UNITS = {"valuetext.h": "valuetext.c", "wire.h": "wire.c"}  # a header -> the compilation unit of what it declares, built into each includer
# (module, source, shared headers it includes: a change to one rebuilds it)
CORE = (
    ("probe.capture._pcaprecords", "probe/capture/_pcaprecords.c", ("extmodule.h", "model.h", "records.h", "wire.h")),
    ("probe.capture._ring", "probe/capture/_ring.c", ("extmodule.h", "model.h", "records.h")),
    ("probe.capture._dnstaprecv", "probe/capture/_dnstaprecv.c", ()),
    ("probe.decode._fastwire", "probe/decode/_fastwire.c", ("extmodule.h", "model.h", "valuetext.h", "wire.h")),
    ("probe.decode._dnstap", "probe/decode/_dnstap.c", ("decoderec_api.h", "extmodule.h", "model.h", "records.h")),
    ("probe.decode._tcpstream", "probe/decode/_tcpstream.c", ("extmodule.h", "tcpstream_api.h")),
    ("export.cdns._cdnsblock", "export/cdns/_cdnsblock.c",
     ("extmodule.h", "fastint.h", "model.h", "records.h", "wire.h")),
    # Lookups over a record table's string columns: enrichment and client privacy.
    ("export._lookup", "export/_lookup.c", ("extmodule.h", "strcolumn.h")),
    ("export.enrich._psl", "export/enrich/_psl.c", ("extmodule.h", "psl_api.h", "strcolumn.h")),
    ("export._topk", "export/_topk.c", ("extmodule.h", "psl_api.h", "strcolumn.h")),
    ("export.enrich._resolvers", "export/enrich/_resolvers.c", ("extmodule.h", "valuetext.h")),
    ("export.parquet._answers", "export/parquet/_answers.c", ("extmodule.h", "strcolumn.h", "valuetext.h", "wire.h")),
    # The columnar pipeline: message records (probe._records) decoded, matched and written to Parquet in C.
    ("probe._records", "probe/_records.c", ("extmodule.h", "model.h", "records.h", "valuetext.h")),
    ("probe.decode._decoderec", "probe/decode/_decoderec.c",
     ("decoderec_api.h", "extmodule.h", "model.h", "records.h", "tcpstream_api.h", "valuetext.h", "wire.h")),
    ("probe.match._matchrec", "probe/match/_matchrec.c", ("extmodule.h", "model.h", "records.h")),
    ("export.parquet._parquetrec", "export/parquet/_parquetrec.c",
     ("extmodule.h", "model.h", "records.h", "valuetext.h")),
)
DPDK = ("probe.capture._dpdk", "probe/capture/_dpdk.c", ("extmodule.h", "model.h", "records.h", "wire.h"))
# The extensions build without a warning at these (tests/run/test_native_build.py fails on a new one)
WARNINGS = ("-Wall", "-Wextra")


class ParallelBuildExt(build_ext):
    """build_ext compiling one extension per core unless told otherwise (-j): pip builds a wheel without it."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext):
        # Objects in a directory of the extension's own: the UNITS built into several extensions at once (threads)
        # must not write one object file. A copy of the command, as the threads share this one.
        own = copy.copy(self)
        own.build_temp = os.path.join(self.build_temp, ext.name)
        super(ParallelBuildExt, own).build_extension(ext)


def pkg_config(*args):
    """pkg-config's output split into words, or None when it or libdpdk is missing."""
    try:
        proc = subprocess.run(["pkg-config", *args, "libdpdk"], capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout.split() if proc.returncode == 0 else None


def extension(name, source, headers=(), cflags=(), libs=()):
    units = [f"{INCLUDE}/{UNITS[h]}" for h in headers if h in UNITS]
    return Extension(
        name,
        [source, *units],
        include_dirs=[INCLUDE],
        depends=[f"{INCLUDE}/{h}" for h in headers],
        extra_compile_args=[*cflags, "-O2", *WARNINGS],
        extra_link_args=list(libs),
        optional=True,
    )


def extensions():
    out = [extension(*spec) for spec in CORE]
    cflags, libs = pkg_config("--cflags"), pkg_config("--libs")
    if cflags is None or libs is None:
        print("dnsprobe: libdpdk not found with pkg-config: building without DPDK support")
    else:
        out.append(extension(*DPDK, cflags=cflags, libs=libs))
    return out


setup(ext_modules=extensions(), cmdclass={"build_ext": ParallelBuildExt})

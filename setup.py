"""Build the C extensions: probe._columns (record columns), probe.sources._pcaprecords (pcap records),
probe._match (matching), probe.decode._fastwire (DNS walker and frame fast path) and export._cdnsblock
(C-DNS blocks) always, and the optional DPDK extension (probe.sources._dpdk) when libdpdk is found with pkg-config.

Everything else about the package is in pyproject.toml. Without libdpdk (Debian: apt-get install
libdpdk-dev pkg-config) the package installs and works as before; `dnsprobe capture --dpdk` then says
that DPDK support was not built.
"""

import subprocess

from setuptools import Extension, setup


def pkg_config(*args):
    """pkg-config's output split into words, or None when it or libdpdk is missing."""
    try:
        proc = subprocess.run(["pkg-config", *args, "libdpdk"], capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout.split() if proc.returncode == 0 else None


def dpdk_extensions():
    cflags, libs = pkg_config("--cflags"), pkg_config("--libs")
    if cflags is None or libs is None:
        print("dnsprobe: libdpdk not found with pkg-config: building without DPDK support")
        return []
    return [
        Extension(
            "probe.sources._dpdk",
            ["probe/sources/_dpdk.c"],
            extra_compile_args=[*cflags, "-O2", "-Wno-unused-parameter"],
            extra_link_args=libs,
            optional=True,  # no compiler or no Python headers: a warning, and the package without DPDK
        )
    ]


def core_extensions():
    """Built everywhere; optional=True so that a machine without a compiler still installs (the package then
    uses its slower pure-Python paths and says so; the tests fail, so CI cannot miss it)."""
    fastint = ["probe/fastint.h"]  # the header some of them include: a change rebuilds them
    return [
        _optional("probe._columns", "probe/_columns.c", fastint),
        _optional("probe.sources._pcaprecords", "probe/sources/_pcaprecords.c"),
        _optional("probe.decode._fastwire", "probe/decode/_fastwire.c"),
        _optional("export._cdnsblock", "export/_cdnsblock.c", fastint),
        _optional("probe._match", "probe/_match.c", fastint),
    ]


def _optional(name, source, depends=()):
    return Extension(name, [source], depends=list(depends), extra_compile_args=["-O2"], optional=True)


setup(ext_modules=core_extensions() + dpdk_extensions())

"""A dnstap frame through the C decoder (probe.decode._dnstap, message records), the Python decoder (message tuples)
and protobuf's own parser (upb): the C reader accepts exactly what upb accepts, and both decoders give the same
messages (the records read back as tuples, field by field), counters and refusals. The entry point is
tests/decode/fuzz_dnstap.py's one_input (which tests/decode/test_dnstap_c.py also runs over crafted and mutated
frames); this runs it under atheris with the fuzz build."""

import importlib.util

from harness import ROOT, run

_spec = importlib.util.spec_from_file_location("dnstap_entry", ROOT / "tests" / "decode" / "fuzz_dnstap.py")
_entry = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_entry)
assert _entry._dnstap is not None, "probe.decode._dnstap is not built"
one_input = _entry.one_input

if __name__ == "__main__":
    run(one_input)

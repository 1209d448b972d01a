"""What the dnstap decoder makes of each dnstap message type: one table.

A message type names who logged a message and which half of an exchange it is: queries are odd, responses
even. The family (auth, client, ...) goes to the dnstap_type column, keeps the messages of one family
apart in matching (a resolver's RESOLVER_QUERY and an authoritative server's AUTH_RESPONSE of the same
exchange must not pair), and gives the C-DNS qr-type. Default selection: the messages of a server
answering its own clients, CLIENT_* (resolvers) and AUTH_* (authoritative servers).
"""

# dnstap Message.Type number -> (name, family, response)
MESSAGE_TYPES = {
    1: ("AUTH_QUERY", "auth", False),
    2: ("AUTH_RESPONSE", "auth", True),
    3: ("RESOLVER_QUERY", "resolver", False),
    4: ("RESOLVER_RESPONSE", "resolver", True),
    5: ("CLIENT_QUERY", "client", False),
    6: ("CLIENT_RESPONSE", "client", True),
    7: ("FORWARDER_QUERY", "forwarder", False),
    8: ("FORWARDER_RESPONSE", "forwarder", True),
    9: ("STUB_QUERY", "stub", False),
    10: ("STUB_RESPONSE", "stub", True),
    11: ("TOOL_QUERY", "tool", False),
    12: ("TOOL_RESPONSE", "tool", True),
    13: ("UPDATE_QUERY", "update", False),
    14: ("UPDATE_RESPONSE", "update", True),
}
TYPE_NAMES = tuple(name for name, _, _ in MESSAGE_TYPES.values())
# The families in type order: a message record stores its family as the index here + 1, (type + 1) // 2
# (include/records.h FAMILY_NAMES; tests/decode/test_dnstap_c.py checks both).
FAMILIES = tuple(dict.fromkeys(family for _, family, _ in MESSAGE_TYPES.values()))
DEFAULT_TYPES = ("AUTH_QUERY", "AUTH_RESPONSE", "CLIENT_QUERY", "CLIENT_RESPONSE")
# The statistics counter of each type (probe.stats): messages received, selected or not.
TYPE_COUNTERS = {number: f"dnstap_{name.lower()}" for number, (name, _, _) in MESSAGE_TYPES.items()}

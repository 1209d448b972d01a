"""The dnstap protobuf schema (dnstap.proto, from dnstap.info) as a table, made into message classes at import.

No protoc and no generated module: the table is built into a FileDescriptorProto, added to a descriptor
pool of our own (the default pool may hold another library's "dnstap" package) and the protobuf runtime
makes the classes from it, as a generated dnstap_pb2 does when it is imported. Field numbers and enum
values are the schema's, up to http_protocol (16) and DOQ (7). The message types are in dnstap_types.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import api_implementation

from probe.decode.dnstap_types import MESSAGE_TYPES

F = descriptor_pb2.FieldDescriptorProto
OPT, REQ = F.LABEL_OPTIONAL, F.LABEL_REQUIRED

ENUMS = {
    "SocketFamily": {"INET": 1, "INET6": 2},
    "SocketProtocol": {"UDP": 1, "TCP": 2, "DOT": 3, "DOH": 4, "DNSCryptUDP": 5, "DNSCryptTCP": 6, "DOQ": 7},
    "HttpProtocol": {"HTTP1": 1, "HTTP2": 2, "HTTP3": 3},
}

NESTED_ENUMS = {
    "Dnstap": {"Type": {"MESSAGE": 1}},
    "Policy": {
        "Match": {"QNAME": 1, "CLIENT_IP": 2, "RESPONSE_IP": 3, "NS_NAME": 4, "NS_IP": 5},
        "Action": {"NXDOMAIN": 1, "NODATA": 2, "PASS": 3, "DROP": 4, "TRUNCATE": 5, "LOCAL_DATA": 6},
    },
    "Message": {"Type": {name: number for number, (name, _, _) in MESSAGE_TYPES.items()}},
}

# message: (field name, number, label, type, enum or message type name)
MESSAGES = {
    "Dnstap": (
        ("identity", 1, OPT, F.TYPE_BYTES, None),
        ("version", 2, OPT, F.TYPE_BYTES, None),
        ("extra", 3, OPT, F.TYPE_BYTES, None),
        ("message", 14, OPT, F.TYPE_MESSAGE, ".dnstap.Message"),
        ("type", 15, REQ, F.TYPE_ENUM, ".dnstap.Dnstap.Type"),
    ),
    "Policy": (
        ("type", 1, OPT, F.TYPE_STRING, None),
        ("rule", 2, OPT, F.TYPE_BYTES, None),
        ("action", 3, OPT, F.TYPE_ENUM, ".dnstap.Policy.Action"),
        ("match", 4, OPT, F.TYPE_ENUM, ".dnstap.Policy.Match"),
        ("value", 5, OPT, F.TYPE_BYTES, None),
    ),
    "Message": (
        ("type", 1, REQ, F.TYPE_ENUM, ".dnstap.Message.Type"),
        ("socket_family", 2, OPT, F.TYPE_ENUM, ".dnstap.SocketFamily"),
        ("socket_protocol", 3, OPT, F.TYPE_ENUM, ".dnstap.SocketProtocol"),
        ("query_address", 4, OPT, F.TYPE_BYTES, None),
        ("response_address", 5, OPT, F.TYPE_BYTES, None),
        ("query_port", 6, OPT, F.TYPE_UINT32, None),
        ("response_port", 7, OPT, F.TYPE_UINT32, None),
        ("query_time_sec", 8, OPT, F.TYPE_UINT64, None),
        ("query_time_nsec", 9, OPT, F.TYPE_FIXED32, None),
        ("query_message", 10, OPT, F.TYPE_BYTES, None),
        ("query_zone", 11, OPT, F.TYPE_BYTES, None),
        ("response_time_sec", 12, OPT, F.TYPE_UINT64, None),
        ("response_time_nsec", 13, OPT, F.TYPE_FIXED32, None),
        ("response_message", 14, OPT, F.TYPE_BYTES, None),
        ("policy", 15, OPT, F.TYPE_MESSAGE, ".dnstap.Policy"),
        ("http_protocol", 16, OPT, F.TYPE_ENUM, ".dnstap.HttpProtocol"),
    ),
}


def _enum(protos, name, values):
    e = protos.add(name=name)
    for vname, number in values.items():
        e.value.add(name=vname, number=number)


def file_descriptor():
    """The schema as a FileDescriptorProto (package dnstap, proto2)."""
    f = descriptor_pb2.FileDescriptorProto(name="dnsprobe/dnstap.proto", package="dnstap", syntax="proto2")
    for name, values in ENUMS.items():
        _enum(f.enum_type, name, values)
    for mname, fields in MESSAGES.items():
        m = f.message_type.add(name=mname)
        for ename, values in NESTED_ENUMS.get(mname, {}).items():
            _enum(m.enum_type, ename, values)
        for fname, number, label, ftype, type_name in fields:
            fd = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                fd.type_name = type_name
    return f


_pool = descriptor_pool.DescriptorPool()
_pool.Add(file_descriptor())
Dnstap = message_factory.GetMessageClass(_pool.FindMessageTypeByName("dnstap.Dnstap"))
Message = message_factory.GetMessageClass(_pool.FindMessageTypeByName("dnstap.Message"))
# "upb" where protobuf's C runtime is installed; the pure-Python one ("python") is far slower (the stats say so).
PROTOBUF_BACKEND = api_implementation.Type()

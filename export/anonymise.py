"""Client-address privacy: cryptopANT anonymisation (Crypto-PAn) and prefix truncation.

Anonymisation is prefix-preserving (Crypto-PAn) and gives, for the same key file, exactly the addresses
that cryptopANT (and so CZ.NIC DNS Probe, which calls scramble_ip4/scramble_ip6 with no passed-through
bits) gives. How cryptopANT computes an address, as implemented here:

- Key file: one line `C4:C6:KEY:PAD:MAC:IV`, C4/C6 the algorithm for IPv4/IPv6 as one hex byte
  (01 md5, 02 blowfish, 03 aes, 04 sha1), the others hex strings (KEY 16 bytes and PAD 32 bytes when
  generated; MAC and IV are not used for addresses). A PAD shorter than 32 bytes is padded with zeros.
- IPv4: the first 1, 2, 3 or 4 bits (class A, B, C, D) and all of class E are kept. For every other bit
  position p (0 = least significant), bit p is flipped by one pseudo-random bit computed from a 32-byte
  block: the address's bits above p, the rest of the 32-bit word filled from the top of PAD's first
  4 bytes (read as a little-endian integer), stored little-endian, followed by PAD[4:32]. The flip is the
  lowest bit of the first output byte of AES-ECB (block[:16]), Blowfish-ECB (block[:8]), MD5(block[:16])
  or SHA-1(block[:20]).
- IPv6: all 128 bits, word (32 bits) by word. For word w the block is the address's words before w, the
  word built as above from the big-endian PAD word w, then PAD from word w + 1 on; the flip is the lowest
  bit of output byte 15 of AES-ECB (block[:16]), Blowfish-CBC with a zero IV (block[:16]), MD5(block[:16])
  or SHA-1(block[:20]).

Every block depends only on the input address, so one address costs one cipher call over 32 (IPv4) or
128 (IPv6) blocks; the row builder caches each client's text.
"""

import dataclasses
import ipaddress
import os
import struct
from pathlib import Path

from probe.errors import ConfigError

ALGORITHMS = {1: "md5", 2: "blowfish", 3: "aes", 4: "sha1"}
ALGORITHM_CODES = {name: code for code, name in ALGORITHMS.items()}
KEY_FILE_KEY = "privacy.key_file"
_MAX_FIELD = 32  # bytes: cryptopANT's MAX_BLK_LENGTH, the longest field it reads
# IPv4 bits kept as they are, by the first 4 bits of the address (classes A, B, C, D, E).
_CLASS_BITS = (1,) * 8 + (2,) * 4 + (3,) * 2 + (4, 32)
_M32 = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class CryptoPAnKey:
    c4: int  # algorithm code for IPv4
    c6: int  # algorithm code for IPv6
    key: bytes
    pad: bytes  # always 32 bytes here
    mac: bytes = b""
    iv: bytes = b""

    def algorithm4(self):
        """The name of the IPv4 algorithm (md5, blowfish, aes, sha1): what may be said of a key."""
        return ALGORITHMS[self.c4]

    def algorithm6(self):
        return ALGORITHMS[self.c6]

    def text(self):
        """The key file line, as cryptopANT writes it."""
        fields = [f"{self.c4:02x}", f"{self.c6:02x}", self.key.hex(), self.pad.hex(), self.mac.hex(), self.iv.hex()]
        return ":".join(fields) + "\n"


def new_key(algorithm="aes"):
    """A fresh random key, as cryptopANT makes one: 16-byte key, 32-byte pad, 16-byte IV, no MAC part."""
    code = ALGORITHM_CODES[algorithm]
    return CryptoPAnKey(code, code, os.urandom(16), os.urandom(32), b"", os.urandom(16))


def write_key_file(path, key, force=False):
    """Write a key file readable by its owner only; refuses to replace an existing file unless force."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"key file {path} already exists (--force replaces it)") from None
    except OSError as exc:
        raise ConfigError(f"key file {path}: cannot create it: {exc.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(key.text())
    os.chmod(path, 0o600)


def read_key_file(path, config_key=KEY_FILE_KEY):
    """Parse a cryptopANT key file; ConfigError naming config_key and the problem when it is unusable."""

    def bad(problem):
        return ConfigError(f"config key '{config_key}': key file {path}: {problem}")

    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        raise bad("no such file (create one with `dnsprobe keygen FILE`)") from None
    except IsADirectoryError:
        raise bad("is a directory") from None
    except OSError as exc:
        raise bad(exc.strerror) from None
    except UnicodeDecodeError:
        raise bad("not a cryptopANT key file (not text)") from None
    fields = text.strip().split(":")
    names = ("IPv4 algorithm", "IPv6 algorithm", "key", "pad", "mac", "iv")
    if len(fields) < 4 or len(fields) > len(names):
        raise bad(f"expected C4:C6:KEY:PAD[:MAC:IV] (cryptopANT format), found {len(fields)} field(s)")
    values = []
    for name, field in zip(names, fields):
        try:
            raw = bytes.fromhex(field)
        except ValueError:
            raise bad(f"the {name} field {field[:40]!r} is not an even number of hex digits") from None
        if len(raw) > _MAX_FIELD:
            raise bad(f"the {name} field is {len(raw)} bytes long; cryptopANT reads at most {_MAX_FIELD}")
        values.append(raw)
    values += [b""] * (len(names) - len(values))
    c4, c6, key, pad, mac, iv = values
    codes = []
    for name, raw in (("IPv4 algorithm", c4), ("IPv6 algorithm", c6)):
        if len(raw) != 1 or raw[0] not in ALGORITHMS:
            known = ", ".join(f"{c:02x} {n}" for c, n in ALGORITHMS.items())
            raise bad(f"the {name} field {raw.hex()!r} is not one of {known}")
        codes.append(raw[0])
    if not key:
        raise bad("the key field is empty")
    if not pad:
        raise bad("the pad field is empty")
    if ALGORITHM_CODES["aes"] in codes and len(key) not in (16, 24, 32):
        raise bad(f"an AES key is 16, 24 or 32 bytes, not {len(key)}")
    if ALGORITHM_CODES["blowfish"] in codes and not 4 <= len(key) <= 56:
        raise bad(f"a Blowfish key is 4 to 56 bytes, not {len(key)}")
    return CryptoPAnKey(codes[0], codes[1], key, pad.ljust(_MAX_FIELD, b"\0"), mac, iv)


# ---------------------------------------------------------------------------------------------
# The pseudo-random bit functions: blocks (32 bytes each) in, one bit per block out.


def _ecb(algorithm, key):
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    return Cipher(algorithm(key), modes.ECB()).encryptor().update


def _aes(key):
    from cryptography.hazmat.primitives.ciphers.algorithms import AES

    encrypt = _ecb(AES, key)

    def bits(blocks, byte):
        out = encrypt(b"".join(b[:16] for b in blocks))
        return [out[i] & 1 for i in range(byte, len(out), 16)]

    return bits, bits


def _blowfish(key):
    from cryptography.hazmat.decrepit.ciphers.algorithms import Blowfish

    encrypt = _ecb(Blowfish, key)

    def bits4(blocks, byte):
        out = encrypt(b"".join(b[:8] for b in blocks))
        return [out[i] & 1 for i in range(byte, len(out), 8)]

    def bits6(blocks, byte):
        # CBC over block[:16] with a zero IV, byte 15 of the output: the second cipher block is
        # E(E(block[:8]) xor block[8:16]); compute every first block at once, then every second.
        first = encrypt(b"".join(b[:8] for b in blocks))
        second = b"".join(
            (int.from_bytes(first[8 * j : 8 * j + 8], "big") ^ int.from_bytes(b[8:16], "big")).to_bytes(8, "big")
            for j, b in enumerate(blocks)
        )
        out = encrypt(second)
        return [out[i] & 1 for i in range(byte - 8, len(out), 8)]

    return bits4, bits6


def _digest(name, length):
    import hashlib  # with OpenSSL: loaded only for a key that uses it

    new = getattr(hashlib, name)

    def bits(blocks, byte):
        return [new(b[:length]).digest()[byte] & 1 for b in blocks]

    return bits, bits


def _bit_functions(code, key):
    """(IPv4 bits, IPv6 bits) for one algorithm code."""
    name = ALGORITHMS[code]
    if name == "aes":
        return _aes(key)
    if name == "blowfish":
        return _blowfish(key)
    return _digest("md5", 16) if name == "md5" else _digest("sha1", 20)


class CryptoPAn:
    """cryptopANT's scramble_ip4 / scramble_ip6 (no passed-through bits) on packed addresses.

    As cryptopANT does, the flips of the upper bits are cached by prefix (the upper 24 bits of an IPv4
    address, the upper 64 of an IPv6 one): they depend on nothing else, so an address in a known prefix
    costs only the blocks of its lower bits."""

    def __init__(self, key, max_cache=1 << 20):
        self.key = key
        self._bits4 = _bit_functions(key.c4, key.key)[0]
        self._bits6 = _bit_functions(key.c6, key.key)[1]
        self._pad4 = int.from_bytes(key.pad[:4], "little")
        self._pad4_tail = key.pad[4:]
        self._pad6 = struct.unpack("!4I", key.pad[:16])
        self._upper4 = {}  # address >> 8 -> flips of bits 8..31
        self._upper6 = {}  # first 8 bytes -> flips of the first two words
        self._max_cache = max_cache

    def ip4(self, packed):
        x = int.from_bytes(packed, "big")
        keep = _CLASS_BITS[x >> 28]
        cache = self._upper4
        upper = cache.get(x >> 8)
        if upper is not None:
            keep = 24
        pad, tail = self._pad4, self._pad4_tail
        # One block per anonymised bit position p = 31 - i, from the lowest (i = 31) up.
        blocks = [
            (((x & (_M32 << (32 - i))) & _M32) | (pad >> i)).to_bytes(4, "little") + tail
            for i in range(31, keep - 1, -1)
        ]
        flips = 0
        if blocks:
            for p, bit in enumerate(self._bits4(blocks, 0)):
                flips |= bit << p
        if upper is None:
            if len(cache) >= self._max_cache:
                cache.clear()
            cache[x >> 8] = flips & ~0xFF
        else:
            flips |= upper
        return (x ^ flips).to_bytes(4, "big")

    def ip6(self, packed):
        words = struct.unpack("!4I", packed)
        pad = self.key.pad
        cache = self._upper6
        upper = cache.get(packed[:8])
        first = 0 if upper is None else 2
        blocks = []
        for w in range(first, 4):
            head, tail, x, hp = packed[: 4 * w], pad[4 * w + 4 :], words[w], self._pad6[w]
            blocks += [
                head + (((x & (_M32 << (32 - i))) & _M32) | (hp >> i)).to_bytes(4, "big") + tail
                for i in range(31, -1, -1)
            ]
        bits = self._bits6(blocks, 15)
        flips = [] if upper is None else list(upper)
        for j in range(0, len(bits), 32):
            f = 0
            for p, bit in enumerate(bits[j : j + 32]):
                f |= bit << p
            flips.append(f)
        if upper is None:
            if len(cache) >= self._max_cache:
                cache.clear()
            cache[packed[:8]] = (flips[0], flips[1])
        return struct.pack("!4I", *(w ^ f for w, f in zip(words, flips)))


# ---------------------------------------------------------------------------------------------
# What the row builder applies to client addresses


def _mask_bytes(length, prefix):
    bits = length * 8
    return (((1 << prefix) - 1) << (bits - prefix)).to_bytes(length, "big")


class ClientPrivacy:
    """The transformation of client addresses: anonymise (optional), then keep a /N prefix (optional)."""

    def __init__(self, cryptopan=None, prefix4=32, prefix6=128):
        self.cryptopan = cryptopan
        self.prefix4, self.prefix6 = prefix4, prefix6
        self._mask4 = int.from_bytes(_mask_bytes(4, prefix4), "big") if prefix4 < 32 else None
        self._mask6 = int.from_bytes(_mask_bytes(16, prefix6), "big") if prefix6 < 128 else None

    def address(self, packed, prefix=None):
        """Packed address → packed address; `prefix` additionally keeps only its first `prefix` bits."""
        v4 = len(packed) == 4
        if self.cryptopan is not None:
            packed = self.cryptopan.ip4(packed) if v4 else self.cryptopan.ip6(packed)
        mask = self._mask4 if v4 else self._mask6
        if prefix is not None:
            extra = int.from_bytes(_mask_bytes(len(packed), prefix), "big")
            mask = extra if mask is None else mask & extra
        if mask is not None:
            packed = (int.from_bytes(packed, "big") & mask).to_bytes(len(packed), "big")
        return packed

    def subnet(self, text):
        """An EDNS client-subnet 'address/source-prefix' treated as a client address: anonymised and
        truncated like one, then cut to its source prefix (the bits the client sent)."""
        if not text:
            return text
        address, sep, prefix = text.partition("/")
        try:
            ip = ipaddress.ip_address(address)
            prefix_len = int(prefix) if sep else ip.max_prefixlen
        except ValueError:
            return ""  # not an address: nothing of it is written
        prefix_len = max(0, min(prefix_len, ip.max_prefixlen))
        out = ipaddress.ip_address(self.address(ip.packed, prefix_len))
        return f"{out}/{prefix}" if sep else str(out)


def client_privacy(privacy_cfg):
    """The ClientPrivacy of a configuration, or None when client addresses are written as they are.
    Reads and checks the key file: a ConfigError names the key and the problem."""
    cfg = privacy_cfg
    cryptopan = None
    if cfg.anonymize:
        if not cfg.key_file:
            raise ConfigError(
                f"config key '{KEY_FILE_KEY}': privacy.anonymize is true but no key file is set "
                "(--anonymize-key FILE; `dnsprobe keygen FILE` creates one)"
            )
        cryptopan = CryptoPAn(read_key_file(cfg.key_file))
    if cryptopan is None and cfg.client_ipv4_prefix == 32 and cfg.client_ipv6_prefix == 128:
        return None
    return ClientPrivacy(cryptopan, cfg.client_ipv4_prefix, cfg.client_ipv6_prefix)

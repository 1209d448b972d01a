"""`dnsprobe keygen`: a new cryptopANT key file for anonymising client addresses."""

import sys


def add_parser(sub):
    keygen = sub.add_parser(
        "keygen",
        help="create a cryptopANT key file for anonymising client addresses",
        description="Create a new random key file in cryptopANT's format (the format DNS Probe reads), readable\n"
        "by its owner only. The same key file gives the same anonymised addresses in dnsprobe, DNS Probe\n"
        "and cryptopANT's scramble_ips. Use it with --anonymize-key FILE or privacy.key_file.",
    )
    keygen.add_argument("file", metavar="FILE", help="key file to create")
    keygen.add_argument("--algorithm", choices=("aes", "blowfish", "md5", "sha1"), default="aes",
                        help="cryptopANT algorithm for IPv4 and IPv6 (default aes)")
    keygen.add_argument("--force", action="store_true", help="replace FILE if it exists")


def run(args):
    from export.anonymise import new_key, write_key_file

    write_key_file(args.file, new_key(args.algorithm), force=args.force)
    print(f"dnsprobe: wrote a new {args.algorithm} key to {args.file} (mode 0600); keep it secret and keep a copy: "
          "without it the anonymised addresses cannot be matched with new data", file=sys.stderr)
    return 0



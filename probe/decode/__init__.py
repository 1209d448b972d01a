"""Decoding stage: frames → DNS message tuples (link layer, IP, fragments, UDP/TCP, DNS)."""

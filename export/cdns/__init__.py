"""C-DNS (RFC 8618): format constants (format.py), blocks (block.py, _cdnsblock.c), the file writer (writer.py),
the reader (reader.py) and the pcap rebuilt from C-DNS (pcap.py)."""

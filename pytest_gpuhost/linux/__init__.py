"""Linux facts: pure parsers of kernel formats (PCI config space, kmsg records, PCI addresses).
No host access here: callers read the bytes through a Host and hand them in."""

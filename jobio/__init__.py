"""Job I/O, the floor under every layer: paths on any FileSystems scheme, the lease, input
listing and the run folder's rules (refuse, resume, grow, overwrite, reconcile).

It imports only ``specrag`` itself and ``schemas``, so retrieval, evaluation, transforms and the
jobs can all stand on it without importing each other.
"""

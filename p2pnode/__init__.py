"""p2pnode: a peer-to-peer training daemon (Cui 2019, Algorithm 1, with sparse-encoded weights)."""

__version__ = "0.2.0.dev0"  # the one source of the version (pyproject reads it)

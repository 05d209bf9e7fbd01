"""Gossip, the default mode: every node trains on its own and averages with one peer's public
copy at a time (Cui 2019, Algorithm 1). Its daemon side is the exchange actor (``p2pnode/daemon/
exchange.py``; every mode's status reads the exchange's records, so the node owns it), its
worker the peer worker (``p2pnode/worker/main.py``, or the stub); ``mode.py`` plugs it in."""

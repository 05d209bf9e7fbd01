"""The exchange: how a node fetches its peers' models and what it keeps of them.

``rounds.py`` is the exchange actor (``Exchange``: pick a peer, fetch its model, hand it to the
worker; gossip's rounds, and the consensus finish after training), ``peer_record.py`` what it
keeps per peer and in all, ``bootstrap.py`` a fresh node's start (voted on by its peers),
``consensus.py`` the consensus finish's bookkeeping, ``pace.py`` the bounded lead over the peers
(``exchange.max_lead``). The node owns it whatever its mode (every mode's status reads it);
gossip runs its rounds (p2pnode/gossip/mode.py). Torch-free, like the rest of the daemon.
"""

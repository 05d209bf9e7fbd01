"""Parameter-server mode: ``node.role = "ps"`` (the server) and ``"ps-worker"`` (its workers).

The classic centralised baseline the paper compares against, built from p2pnode's own parts so a
comparison measures the topology, not two code bases: the same aiohttp transport, guard and
signing, the same payload codec (``p2pnode/wire``), the same data, model and training worker
process. The server's worker holds the model and applies each pushed (compressed) gradient the
moment it arrives, asynchronously, with the configured momentum SGD; its daemon serves the
weights with ``GET /v1/model`` exactly as a peer serves its own. A worker pulls the weights,
computes one batch's gradient, compresses it (``compression.gradient``) and pushes it to
``POST /v1/ps/gradient``. The server waits for no worker, so a dead one never stalls it.

Daemon side (torch-free): ``mode.py`` (the two roles plugged into the daemon),
``gradient_route.py`` (the push endpoint), ``push_pull.py`` (a worker's push and pull actor).
Worker processes (torch): ``worker_server.py``, ``worker_client.py``; the gradient payload both
share is ``worker_gradient.py``; the pipe messages they add are ``messages.py``.
"""

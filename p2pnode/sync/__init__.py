"""A synchronous mode (``exchange.sync = "powersgd"``): every step, the nodes' gradients are
averaged through a compressed all-reduce (PowerSGD), so every node applies the network's mean
gradient and none drifts towards its own classes. See docs/ALGORITHMS.md, "Synchronous
PowerSGD"."""

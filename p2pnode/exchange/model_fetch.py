"""A model GET outside the gossip exchange (the synchronous mode's catch-up, a ps-worker's pull)
under the exchange's rules: the answer may take ``exchange.timeout`` to begin and a second
more per 20 MB of the model the peer may copy first, its body then has a deadline from its
size and the rate measured from that peer (``exchange.max_transfer`` at most), it is cut off
below ``exchange.min_rate``, and it is read into one buffer in a thread (net/client.py
``fetch``). ``request()``'s single fixed timeout cut a big model's snapshot off.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pnode.config import ExchangeConfig
from p2pnode.net.client import ModelAnswer, PeerClient
from p2pnode.net.deadline import Transfer, update_rate


@dataclass
class ModelFetcher:
    """Fetches models from peers, keeping each peer's measured rate (what its next body's
    deadline and cut-off follow)."""

    client: PeerClient
    cfg: ExchangeConfig

    def __post_init__(self) -> None:
        self.rates: dict[str, float] = {}

    def transfer(self, addr: str) -> Transfer:
        x = self.cfg
        return Transfer(x.timeout, max(x.timeout, x.max_transfer), x.min_rate, self.rates.get(addr, 0.0))

    async def get(self, addr: str, path_qs: str, max_body: int, model_bytes: int) -> ModelAnswer:
        """GET ``path_qs`` from ``addr``; ``max_body``: the largest answer of our model,
        ``model_bytes``: its float32 bytes. Raises PeerError (PeerTimeout) as ``fetch``."""
        transfer = self.transfer(addr)
        resp = await self.client.fetch(addr, path_qs, transfer.first_byte(model_bytes), transfer, max_body)
        if resp.wire_bytes > 0:
            self.rates[addr] = update_rate(self.rates.get(addr, 0.0), resp.wire_bytes, resp.body_seconds)
        return resp

"""The node daemon: asyncio actors under one supervisor (see node.py)."""

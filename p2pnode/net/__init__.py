"""Node-to-node HTTP: request signing and the shared client."""

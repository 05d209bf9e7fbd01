"""Cluster membership: who is in the cluster and who is alive (see base.Membership)."""

"""The training worker: a spawned subprocess that owns the model and does all tensor math."""

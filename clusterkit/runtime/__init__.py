"""What runs inside the allocation on every rank: the built-in Trainer runner and the preflight. The only layer that imports torch."""

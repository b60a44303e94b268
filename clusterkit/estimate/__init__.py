"""Estimates from a resolved recipe: a model's parameter count and shape, and per-GPU memory.
Validation warns with them (load) and planning ranks layouts with them (plan)."""

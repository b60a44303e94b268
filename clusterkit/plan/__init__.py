"""Per-GPU memory estimates and ranked layouts for a recipe on its cluster."""

"""From what a user asked (a recipe, overrides, a run to resume, a cluster) to the exact request a
scheduler sends: the orchestration every submitting command shares, kept out of the CLI."""

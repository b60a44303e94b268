"""Text to a resolved recipe: YAML with line numbers, overrides, profile lookup, every rule, with file:line findings."""

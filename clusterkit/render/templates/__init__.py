"""Jinja templates shipped with clusterkit (a data package; ops teams override them by search path)."""

"""Example recipes shipped with clusterkit."""

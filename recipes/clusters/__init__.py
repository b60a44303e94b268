"""Cluster profiles shipped with clusterkit."""

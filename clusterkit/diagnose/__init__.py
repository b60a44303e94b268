"""Checks of a node (doctor) and of a layout's scaling (bench), and the preflight report."""

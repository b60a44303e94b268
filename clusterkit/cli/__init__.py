"""The clusterkit command line: parsing, one module per command group, errors mapped to exit codes in one place."""

"""What a run leaves behind and how to read it back: the run-directory layout, the run record, status, logs, export."""

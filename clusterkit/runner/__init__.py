"""The built-in HF Trainer runner that every rank of a task.trainer job runs."""

"""The `payhooks` command: runs services, migrates, and the operator and developer commands."""

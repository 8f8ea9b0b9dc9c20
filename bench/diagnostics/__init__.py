"""Diagnostics of a mount: a soak under random readers, and what a debug log had in flight."""

"""Probes: run inside the sandbox, call the student's functions on the checker's inputs, return plain data."""

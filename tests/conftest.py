"""Shared fixtures. Every test gets its own temporary var dir (secret key, sqlite files)."""

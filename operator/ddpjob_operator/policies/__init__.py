"""Lifecycle policies, one small pure module each: restart, deadline, ttl, cleanup, suspend."""

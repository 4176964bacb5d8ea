"""Capture configurations, one module per source, on a shared base (:mod:`.base`)."""

"""Shared basics: errors and problems, names and paths, tables, positions and windows, fault
points, progress lines, readiness verdicts, the Spark session.

The ground floor: imports no other stage of the engine.
"""

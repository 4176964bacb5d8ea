"""Planning: what a run does, for every source. The stored offset, reconciled with the sink's
commit log; the snapshot decision and the next window; which Airflow runs capture and which
report; capture gaps; the incremental snapshot's state and signals; the job spec that carries
the plan to the reader.

May import: ``basics``, ``events``, ``sinks`` (the commit log).
"""

"""Reading, the source-neutral part: a snapshot's partitions as Spark tasks, the incremental
snapshot's chunk loop, query-based extraction, and the frame every window job runs in. A source
plugs its readers in (``ChunkReader``, ``QuerySource``, its snapshot and stream functions).

May import: ``basics``, ``events``, ``sinks``, ``planning``.
"""

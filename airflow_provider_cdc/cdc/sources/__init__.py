"""The sources: one folder per database, each with the same named parts (``docs/architecture.md``,
"Adding a source"). A source may import every stage of the engine and the modules of a source
whose protocol it speaks (YugabyteDB's two sources build on PostgreSQL's); the stages never
import a source.
"""

"""A YugabyteDB stand-in for the YugabyteDB source's tests: PostgreSQL 15 emulating YSQL's logical
replication surface (yboutput streaming, HYBRID_TIME/SEQUENCE LSNs, replica identity CHANGE, ...)
behind a PostgreSQL-wire proxy. Test support only; see docs/yugabytedb-standin.md.
"""

from .standin import YugabyteStandIn
from .stream import expiry_message, yb_changes

__all__ = ["YugabyteStandIn", "expiry_message", "yb_changes"]

-- The stand-in server's clock and time zone (loaded after catalog.sql by standin.install).
--
-- SQL Server's clock functions read the operating system's clock and zone: GETDATE()/SYSDATETIME()
-- are local time without an offset, SYSUTCDATETIME()/GETUTCDATE() UTC, SYSDATETIMEOFFSET() local
-- time with the zone's current offset (Microsoft Learn, "Date and time data types and functions",
-- https://learn.microsoft.com/en-us/sql/t-sql/functions/date-and-time-data-types-and-functions-transact-sql,
-- and each function's page, e.g. .../sysdatetimeoffset-transact-sql, example A: SYSDATETIME()
-- 13:10:02 and SYSDATETIMEOFFSET() 13:10:02 -07:00 while SYSUTCDATETIME() is 20:10:02).
-- The capture job writes cdc.lsn_time_mapping's times in that local time (its columns are
-- datetime, no offset: .../system-tables/cdc-lsn-time-mapping-transact-sql), which is why
-- Debezium adds DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) to them (SqlServerConnection.java:84-85).
--
-- Here the zone is an IANA name (PostgreSQL's tz database) and the clock may run ahead of or
-- behind the real one by clock_offset, so that tests can put commits just before and after a DST
-- change. PostgreSQL sessions stay in UTC (datetimeoffset values read back in UTC, as documented).
CREATE TABLE standin.clock (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    time_zone text NOT NULL DEFAULT 'UTC',         -- the server operating system's time zone
    clock_offset interval NOT NULL DEFAULT '0'     -- the server's clock minus the real clock
);
INSERT INTO standin.clock DEFAULT VALUES;

-- The server's clock now (an instant) and an instant of the real clock as the server's local time.
CREATE FUNCTION standin.server_now() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    SELECT clock_timestamp() + (SELECT clock_offset FROM standin.clock)
$$;
CREATE FUNCTION standin.server_local(at timestamptz) RETURNS timestamp LANGUAGE sql STABLE STRICT AS $$
    SELECT at AT TIME ZONE (SELECT time_zone FROM standin.clock)
$$;
-- A commit (or scan) time of the real clock as the capture job writes it: the server's local time,
-- rounded to datetime.
CREATE FUNCTION standin.capture_time(real_at timestamptz) RETURNS timestamp(3) LANGUAGE sql STABLE STRICT AS $$
    SELECT standin.round_datetime(standin.server_local(real_at + (SELECT clock_offset FROM standin.clock)))
$$;

CREATE OR REPLACE FUNCTION sys.getdate() RETURNS timestamp(3) LANGUAGE sql STABLE AS $$
    SELECT standin.round_datetime(standin.server_local(standin.server_now()))
$$;
CREATE OR REPLACE FUNCTION sys.getutcdate() RETURNS timestamp(3) LANGUAGE sql STABLE AS $$
    SELECT standin.round_datetime((standin.server_now() AT TIME ZONE 'UTC')::timestamp)
$$;
CREATE OR REPLACE FUNCTION sys.sysdatetime() RETURNS timestamp(6) LANGUAGE sql STABLE AS $$
    SELECT standin.server_local(standin.server_now())
$$;
CREATE OR REPLACE FUNCTION sys.sysutcdatetime() RETURNS timestamp(6) LANGUAGE sql STABLE AS $$
    SELECT (standin.server_now() AT TIME ZONE 'UTC')::timestamp
$$;
-- The instant; its offset (lost in timestamptz) is what DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) gives.
CREATE OR REPLACE FUNCTION sys.sysdatetimeoffset() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT standin.server_now()
$$;
-- DATEPART(TZOFFSET, SYSDATETIMEOFFSET()): the zone's offset now, in minutes (DATEPART's page:
-- "TZoffset (tz)": the offset in minutes, signed; translate.py routes that exact call here).
CREATE FUNCTION sys.server_tz_offset_minutes() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT (extract(epoch FROM standin.server_local(n) - (n AT TIME ZONE 'UTC')) / 60)::integer
    FROM (SELECT standin.server_now() AS n) now
$$;

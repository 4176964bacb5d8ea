"""Opening Iceberg catalogs: the FileIO and every class pyiceberg imports are the provider's choice.


pyiceberg imports, by the dotted name a property holds, the FileIO (``py-io-impl``), the
catalog (``py-catalog-impl``), the S3 retry strategy (``s3.retry-strategy-impl``), the REST
catalog's auth manager (``auth``: ``{"type": "custom", "impl": ...}``) and a table's location
provider (``write.py-location-provider.impl``): ``importlib.import_module`` in
``pyiceberg/io/__init__.py``, ``io/pyarrow.py``, ``catalog/__init__.py``, ``catalog/rest/auth.py``
and ``table/locations.py`` (every import by name in pyiceberg 0.12.0, the version this was
checked against). Those properties do not only come from the DAG author: a REST catalog server
sends ``defaults`` and ``overrides`` that pyiceberg merges into the catalog's properties (and
reads ``auth`` from while still constructing the catalog), and the FileIO of every table is
built from ``{**catalog properties, **table metadata properties}``, so whoever can answer as
the catalog, or write a table's metadata file (anyone who can write to a local sink), could
name ``subprocess.getoutput`` or ``logging.config.fileConfig`` and run code on the worker.
Refusing such keys in a connection's extra is not enough. So every catalog the provider opens
is a subclass of its own class (:class:`_PinnedCatalog`) that:

- builds every table's FileIO as the provider's choice: ``PyArrowFileIO``, or ``FsspecFileIO``
  when the DAG's own properties name it; no other ``py-io-impl`` is accepted;
- drops from the REST server's config, before the session is made, and from every table's
  metadata and FileIO properties, the keys that make pyiceberg import a class
  (:func:`importing_key`): a forged table is still read, its import keys are ignored (logged,
  by name) and the next commit writes its metadata without them.

The hooks are pyiceberg's own methods (``Catalog._load_file_io``, ``load_table``,
``create_table``, ``register_table``, ``commit_table``; ``RestCatalog._fetch_config``,
``_response_to_table``, ``_response_to_staged_table``), which every catalog and table path of
0.12 goes through; ``tests/integration/test_iceberg_metadata_attacks.py`` checks them against a
malicious REST server and forged metadata, so an upgrade that moves them fails there.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.io import PY_IO_IMPL, FileIO
from pyiceberg.table import Table

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks import object_store

PARTITION_FIELD = "window_id_trunc"
#: Snapshot summary key: the newest window seq the table ever held (every snapshot we make has it).
NEWEST_KEY = "cdc.newest-window-seq"
CONFORMED_SUFFIX = ".conformed.parquet"
COMPACT_TARGET_BYTES = 128 * 1024 * 1024

#: FileIO properties that say which S3 endpoint to reach and as whom (pyiceberg 0.12's ``s3.*``
#: connection keys, its ``client.*`` fallbacks, and a proxy): with an object-store access active
#: they come from it only, never from a catalog server's config or a table's metadata.
_STORE_KEY = re.compile(
    r"^(client\.|s3\.(endpoint|region|resolve-region|access-key-id|secret-access-key|session-token|proxy-uri|"
    r"role-arn|role-session-name|anonymous|force-virtual-addressing|connect-timeout|request-timeout)$)",
    re.IGNORECASE,
)

log = logging.getLogger(__name__)


ARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
FSSPEC_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"
FILE_IOS = (ARROW_FILE_IO, FSSPEC_FILE_IO)


def importing_key(key: str) -> bool:
    """Does property ``key`` make pyiceberg import a class by name? (Every such key of 0.12 has
    ``impl`` in it, and the REST catalog's ``auth`` holds one; ``auth.*`` too, for safety.)"""
    lowered = str(key).lower()
    return "impl" in lowered or lowered == "auth" or lowered.startswith("auth.")


def open_catalog(name: str, properties: Mapping[str, Any]) -> Catalog:
    """``pyiceberg.catalog.load_catalog(name, **properties)``, pinned (see above). A REST catalog
    is constructed as :class:`_PinnedCatalog` directly: pyiceberg reads the server's ``auth``
    while constructing it."""
    from pyiceberg.catalog import PY_CATALOG_IMPL, TYPE, CatalogType, infer_catalog_type

    props = {str(k): v for k, v in properties.items()}
    file_io = _chosen_file_io(props)
    props[PY_IO_IMPL] = file_io
    if not props.get(PY_CATALOG_IMPL):
        from pyiceberg.catalog import _ENV_CONFIG, _check_required_catalog_properties, merge_config

        # As load_catalog does: the worker's own pyiceberg config (~/.pyiceberg.yaml, PYICEBERG_*)
        # under the properties given.
        conf = merge_config(_ENV_CONFIG.get_catalog_config(name) or {}, props)
        given = conf.get(TYPE)
        kind = CatalogType(given.lower()) if isinstance(given, str) and given else infer_catalog_type(name, conf)
        if kind == CatalogType.REST:
            _check_required_catalog_properties(name, kind, conf)
            return _pinned_rest_class()(name, **conf)
    return pin_catalog(load_catalog(name, **props), props)


def pin_catalog(catalog: Catalog, given: Mapping[str, Any] | None = None) -> Catalog:
    """``catalog``, made a :class:`_PinnedCatalog` in place. ``given``: the properties the DAG
    gave it (their import keys stay); None for a catalog made elsewhere (a state table's catalog
    object): then none of its import keys stay but a ``py-io-impl`` naming pyiceberg's own."""
    if isinstance(catalog, _PinnedCatalog):
        return catalog
    current = dict(catalog.properties)
    file_io = _chosen_file_io(current if given is None else given)
    try:
        catalog.__class__ = _pinned_class(type(catalog))
    except TypeError:
        raise CdcConfigurationError(
            f"the Iceberg catalog {type(catalog).__name__} cannot be opened with the provider's FileIO"
        ) from None
    pinned: Any = catalog
    pinned._cdc_file_io = file_io
    pinned.properties = _scrubbed(current, given or {}, file_io, "the catalog's properties")
    return catalog


def _chosen_file_io(properties: Mapping[str, Any]) -> str:
    chosen = properties.get(PY_IO_IMPL)
    if chosen in (None, ""):
        return ARROW_FILE_IO
    if chosen not in FILE_IOS:
        raise CdcConfigurationError(
            f"the Iceberg catalog's properties name py-io-impl {chosen!r}: the provider reads and writes Iceberg "
            f"tables with pyiceberg's own FileIO only ({ARROW_FILE_IO}, the default, or {FSSPEC_FILE_IO}), so that "
            "neither a catalog server nor a table's metadata can choose code to run on the workers"
        )
    return str(chosen)


def _scrubbed(properties: Mapping[str, Any], given: Mapping[str, Any], file_io: str, where: str) -> dict[str, Any]:
    """``properties`` without the import keys ``given`` did not hold (those take ``given``'s
    value), with ``py-io-impl`` the chosen FileIO."""

    def kept(key: str, value: Any) -> bool:
        return value == file_io if key == PY_IO_IMPL else key in given and given[key] == value

    _warn_ignored(sorted(k for k, v in properties.items() if importing_key(k) and not kept(k, v)), where)
    out = {k: v for k, v in properties.items() if not importing_key(k)}
    out.update({k: v for k, v in given.items() if importing_key(k)})
    out[PY_IO_IMPL] = file_io
    return out


def _with_store_access(properties: Mapping[str, Any]) -> dict[str, Any]:
    """``properties`` reaching S3 with the active object-store access (the DAG's
    ``object_store_conn_id``) only: whichever endpoint, region, keys or proxy the catalog's
    properties, a catalog server or a table's metadata named are dropped (anyone who can write a
    table's metadata file could otherwise send its reads and writes to a store of their own).
    Without an active access, pyiceberg's own merge applies (the default credential chain, a REST
    catalog's vended credentials)."""
    access = object_store.current()
    if access is None:
        return dict(properties)
    kept = {k: v for k, v in properties.items() if not _STORE_KEY.match(str(k))}
    return {**kept, **access.iceberg_properties()}


def _clean_metadata(metadata: Any, where: str) -> Any:
    """Table metadata without properties that make pyiceberg import a class."""
    dropped = sorted(k for k in metadata.properties if importing_key(k))
    if not dropped:
        return metadata
    _warn_ignored(dropped, f"the metadata of {where}")
    properties = {k: v for k, v in metadata.properties.items() if k not in dropped}
    return metadata.model_copy(update={"properties": properties})


_warned: set[tuple[str, tuple[str, ...]]] = set()


def _warn_ignored(keys: list[str], where: str) -> None:
    """Once per process and place: a forged table is loaded many times a run."""
    if keys and (where, tuple(keys)) not in _warned:
        _warned.add((where, tuple(keys)))
        log.warning("ignored %s of %s: they would make pyiceberg import a class they name", keys, where)  # names only


def _clean_table(table: Any) -> Any:
    table.metadata = _clean_metadata(table.metadata, _table_name(table.name(), table.metadata_location))
    return table


def _table_name(identifier: Sequence[str], metadata_location: str | None) -> str:
    return f"Iceberg table {'.'.join(identifier)} ({metadata_location})"


class _PinnedCatalog(Catalog):
    """Mixed into the class of every catalog the provider opens (see the comment above). A
    ``Catalog`` itself, so that the subclass has the catalog's layout and a catalog made elsewhere
    can take it in place."""

    _cdc_file_io: str = ARROW_FILE_IO

    def _load_file_io(self, properties: Mapping[str, Any] | None = None, location: str | None = None) -> FileIO:
        # The table's (metadata properties, a REST server's table config and vended credentials):
        # none of its import keys; the catalog's own were scrubbed when it was opened.
        props = {k: v for k, v in (properties or {}).items() if not importing_key(k)}
        props[PY_IO_IMPL] = self._cdc_file_io  # wins over the catalog's in pyiceberg's merge
        io = super()._load_file_io(props, location)  # type: ignore[misc]
        io.properties = _with_store_access(io.properties)  # file systems are built on first use
        return io

    # pyiceberg's SQL, DynamoDB and BigQuery catalogs build some FileIOs from ``self.properties``
    # directly (``load_file_io``): the catalog's own properties carry the active access too, read
    # when asked (the access is the job's, the catalog object may outlive it).
    @property  # type: ignore[override]
    def properties(self) -> dict[str, Any]:
        return _with_store_access(self.__dict__.get("properties", {}))

    @properties.setter
    def properties(self, value: Mapping[str, Any]) -> None:
        # Not the access's own values read back (a REST catalog's config merge): its keys stay
        # out of the stored properties, for when the access is no longer active.
        access = object_store.current()
        overlay = access.iceberg_properties() if access is not None else {}
        self.__dict__["properties"] = {k: v for k, v in value.items() if k not in overlay or overlay[k] != v}

    def load_table(self, identifier: Any) -> Table:
        return _clean_table(super().load_table(identifier))  # type: ignore[misc]

    def create_table(self, *args: Any, **kwargs: Any) -> Table:
        return _clean_table(super().create_table(*args, **kwargs))  # type: ignore[misc]

    def register_table(self, *args: Any, **kwargs: Any) -> Table:
        return _clean_table(super().register_table(*args, **kwargs))  # type: ignore[misc]

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> Any:
        response = super().commit_table(table, requirements, updates)  # type: ignore[misc]
        metadata = _clean_metadata(response.metadata, _table_name(table.name(), response.metadata_location))
        return response if metadata is response.metadata else response.model_copy(update={"metadata": metadata})


class _PinnedRest(_PinnedCatalog):
    """The REST catalog's own hooks: its server's config, and the tables it answers with."""

    def __init__(self, name: str, **properties: Any):
        self._cdc_file_io = properties[PY_IO_IMPL]  # set by open_catalog
        super().__init__(name, **properties)  # type: ignore[call-arg]

    def _fetch_config(self) -> None:
        given: dict[str, Any] = dict(self.properties)  # type: ignore[attr-defined]
        super()._fetch_config()  # type: ignore[misc]
        # Before __init__ makes the session, which imports the class ``auth`` names.
        self.properties = _scrubbed(self.properties, given, self._cdc_file_io, "the REST catalog server's config")

    def _response_to_table(self, identifier_tuple: tuple[str, ...], table_response: Any) -> Any:
        cleaned = _clean_response(identifier_tuple, table_response)
        return super()._response_to_table(identifier_tuple, cleaned)  # type: ignore[misc]

    def _response_to_staged_table(self, identifier_tuple: tuple[str, ...], table_response: Any) -> Any:
        cleaned = _clean_response(identifier_tuple, table_response)
        return super()._response_to_staged_table(identifier_tuple, cleaned)  # type: ignore[misc]


def _clean_response(identifier: tuple[str, ...], response: Any) -> Any:
    metadata = _clean_metadata(response.metadata, _table_name(identifier, response.metadata_location))
    return response if metadata is response.metadata else response.model_copy(update={"metadata": metadata})


@functools.cache
def _pinned_class(cls: type) -> type:
    from pyiceberg.catalog.rest import RestCatalog

    mixin = _PinnedRest if issubclass(cls, RestCatalog) else _PinnedCatalog
    return type(f"Pinned{cls.__name__}", (mixin, cls), {"__module__": __name__})


def _pinned_rest_class() -> type:
    from pyiceberg.catalog.rest import RestCatalog

    return _pinned_class(RestCatalog)

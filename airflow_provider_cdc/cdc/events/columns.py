"""Column selection and masking, as Debezium configures them.

Patterns are regular expressions matched against the whole ``schema.table.column`` name (case
sensitive, like Debezium). Key columns are always kept and never masked, so events stay
mergeable. Masking rules come in Debezium's property form::

    column.mask.with.8.chars                          = public.customers.email,public.*.ssn
    column.mask.hash.SHA-256.with.salt.CzQMA0cB5K     = public.orders.customer_name
    column.truncate.to.20.chars                       = public.products.description

They apply to columns captured as strings; a rule matching a column of another type is a
configuration error (a number cannot hold asterisks).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

if TYPE_CHECKING:  # pyarrow loads where masks apply, not when a DAG file is parsed
    import pyarrow as pa

_MASK = re.compile(r"^column\.mask\.with\.(\d+)\.chars$")
_HASH = re.compile(r"^column\.mask\.hash\.(?:v2\.)?([A-Za-z0-9-]+)\.with\.salt\.(.+)$")
_TRUNCATE = re.compile(r"^column\.truncate\.to\.(\d+)\.chars$")


@dataclass(frozen=True)
class MaskRule:
    pattern: str
    kind: str  # "mask", "hash" or "truncate"
    length: int = 0
    algorithm: str = ""
    salt: str = ""

    def matches(self, qualified: str) -> bool:
        return re.fullmatch(self.pattern, qualified) is not None

    def apply(self, values: pa.Array, max_length: int | None) -> pa.Array:
        """Transform a string array (nulls stay null)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.kind == "truncate":
            return pc.utf8_slice_codeunits(values, 0, self.length)
        if self.kind == "mask":
            return pc.if_else(pc.is_null(values), values, pa.scalar("*" * self.length))
        algorithm = self.algorithm.replace("-", "").lower()

        def digest(text: str) -> str:
            hashed = hashlib.new(algorithm, (self.salt + text).encode()).hexdigest()
            return hashed[:max_length] if max_length else hashed

        return pa.array([None if v is None else digest(v) for v in values.to_pylist()], pa.string())

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ColumnRules:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    masks: tuple[MaskRule, ...] = field(default_factory=tuple)
    as_text: tuple[str, ...] = ()  # columns captured in PostgreSQL's text form, whatever their type

    def __post_init__(self) -> None:
        if self.include and self.exclude:
            raise CdcConfigurationError("give column_include_list or column_exclude_list, not both (like Debezium)")
        for pattern in (*self.include, *self.exclude, *self.as_text, *(m.pattern for m in self.masks)):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise CdcConfigurationError(
                    f"column pattern {pattern!r} is not a valid regular expression: {exc}"
                ) from None
        for mask in self.masks:
            if mask.kind == "hash":
                try:
                    hashlib.new(mask.algorithm.replace("-", "").lower())
                except ValueError:
                    raise CdcConfigurationError(
                        f"unknown hash algorithm {mask.algorithm!r} in a masking rule"
                    ) from None

    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.masks or self.as_text)

    def keeps_text(self, qualified: str) -> bool:
        return any(re.fullmatch(p, qualified) for p in self.as_text)

    def keeps(self, qualified: str, *, is_key: bool) -> bool:
        if is_key:
            return True
        if self.include:
            return any(re.fullmatch(p, qualified) for p in self.include)
        return not any(re.fullmatch(p, qualified) for p in self.exclude)

    def mask_for(self, qualified: str) -> MaskRule | None:
        return next((m for m in self.masks if m.matches(qualified)), None)

    @classmethod
    def from_options(
        cls,
        *,
        include: tuple[str, ...] | list[str] = (),
        exclude: tuple[str, ...] | list[str] = (),
        debezium_properties: Mapping[str, str] | None = None,
        as_text: tuple[str, ...] | list[str] = (),
    ) -> ColumnRules:
        masks = []
        for key, patterns in (debezium_properties or {}).items():
            names = [p.strip() for p in str(patterns).split(",") if p.strip()]
            if match := _MASK.match(key):
                masks += [MaskRule(p, "mask", length=int(match.group(1))) for p in names]
            elif match := _HASH.match(key):
                masks += [MaskRule(p, "hash", algorithm=match.group(1), salt=match.group(2)) for p in names]
            elif match := _TRUNCATE.match(key):
                masks += [MaskRule(p, "truncate", length=int(match.group(1))) for p in names]
            else:
                raise CdcConfigurationError(
                    f"unsupported column rule {key!r}: use column.mask.with.<N>.chars, "
                    "column.mask.hash.<algorithm>.with.salt.<salt> or column.truncate.to.<N>.chars"
                )
        return cls(tuple(include), tuple(exclude), tuple(masks), tuple(as_text))

    def to_dict(self) -> dict:
        return {
            "include": list(self.include),
            "exclude": list(self.exclude),
            "masks": [m.to_dict() for m in self.masks],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ColumnRules:
        return cls(
            tuple(data.get("include", ())),
            tuple(data.get("exclude", ())),
            tuple(MaskRule(**m) for m in data.get("masks", ())),
            tuple(data.get("as_text", ())),
        )

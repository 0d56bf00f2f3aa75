"""The base of every wire-facing model: snake_case in Python, camelCase on the wire, unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_wire(self) -> dict[str, object]:
        """The camelCase JSON form used over HTTP and stored in Redis."""
        return self.model_dump(mode="json", by_alias=True)

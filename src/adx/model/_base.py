"""The base of every wire-facing model: snake_case in Python, camelCase on the wire, unknown keys refused."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict
from pydantic.alias_generators import to_camel


def _integral(value: object) -> object:
    # JSON Schema's "integer" includes 126.0 (RFC 8259 numbers have no int/float distinction): a whole float is
    # that integer; 126.5, "126" and true stay what they are and are refused by the strict check.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: Turns a whole float into its int before the strict integer check (``Annotated[int, Strict(), <bounds>, INTEGRAL]``:
#: bounds before it, so the published schema says ``minimum``/``maximum``, also inside ``X | None``).
INTEGRAL = BeforeValidator(_integral)

#: A JSON integer on the wire: whole numbers only (``126`` or ``126.0``), never a string or a boolean.
WholeNumber = Annotated[int, Strict(), INTEGRAL]


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

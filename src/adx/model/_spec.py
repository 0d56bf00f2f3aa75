"""EnvironmentSpec: what a user asks for when creating an Environment (ENV-1, ENV-5)."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import JsonSchemaValue

from adx.errors import InvalidInputError
from adx.model._base import ApiModel
from adx.model._lifecycle import Lifecycle
from adx.model._network import NetworkPolicy
from adx.model._resources import Resources
from adx.model._volumes import MAX_VOLUME_MOUNTS, VolumeMount

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_ARGS = 256
MAX_ARG_CHARS = 8192  # at most 32 KiB in UTF-8: far inside the kernel's 128 KiB per argument
MAX_ENV_VARS = 256
MAX_METADATA = 64
MAX_METADATA_VALUE = 1024


def _image_name(value: str) -> str:
    if not _IMAGE_NAME.match(value):
        raise ValueError("must be 1-63 lowercase letters, digits, '.', '_' or '-'")
    return value


#: An image's name, as an Environment's spec and sandboxd's Create take it (one rule for both).
ImageName = Annotated[str, AfterValidator(_image_name)]


def _spec_schema(schema: JsonSchemaValue) -> None:
    """The published JSON schema carries the rules the validators below enforce, so a client (or a schema-driven
    fuzzer) that follows the schema is never refused. Kept beside the validators: change both together."""
    props = schema["properties"]
    props["image"]["pattern"] = _IMAGE_NAME.pattern
    # ENV-5: some CPU and memory must be asked for (Resources alone allows 0: a capacity may be zero).
    props["resources"] = {
        "allOf": [props["resources"]],
        "properties": {"cpuMillis": {"minimum": 1}, "memoryBytes": {"minimum": 1}},
        "required": ["cpuMillis", "memoryBytes"],
    }
    no_nul = "^[^\\x00]*$"
    props["entrypoint"]["anyOf"][0].update(
        minItems=1,
        maxItems=MAX_ARGS,
        prefixItems=[{"type": "string", "minLength": 1, "pattern": no_nul}],
        items={"type": "string", "pattern": no_nul, "maxLength": MAX_ARG_CHARS},
    )
    props["env"].update(
        maxProperties=MAX_ENV_VARS,
        propertyNames={"pattern": _ENV_NAME.pattern},
        additionalProperties={"type": "string", "pattern": no_nul},
    )
    props["metadata"].update(
        maxProperties=MAX_METADATA,
        propertyNames={"minLength": 1, "maxLength": 128},
        additionalProperties={"type": "string", "maxLength": MAX_METADATA_VALUE},
    )


#: The images every node has of its own (its ``base`` image and the host-derived skeleton ``host``): never looked
#: up in an image store, never pulled from another node.
NODE_IMAGES = frozenset({"base", "host"})


class EnvironmentSpec(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(json_schema_extra=_spec_schema)

    image: ImageName = Field(default="base", description="the root image (``base`` is the node's default image)")
    resources: Resources
    entrypoint: list[str] | None = Field(default=None, description="optional workload argv, started by execd")
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    network: NetworkPolicy | None = Field(
        default=None, description="none or egress with allow/deny lists; unset: the node's default (mutable)"
    )
    volumes: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_VOLUME_MOUNTS,
        description="the tenant's named volumes mounted read-write (docs/volumes.md); each path once",
    )

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must not be empty when given (omit it for no workload)")
        if len(value) > MAX_ARGS:
            raise ValueError(f"has more than {MAX_ARGS} arguments")
        for arg in value:
            if "\x00" in arg:
                raise ValueError("arguments must not contain NUL bytes")
            if len(arg) > MAX_ARG_CHARS:
                raise ValueError(f"an argument is longer than {MAX_ARG_CHARS} characters")
        if not value[0]:
            raise ValueError("the program (first element) must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_VARS:
            raise ValueError(f"has more than {MAX_ENV_VARS} variables")
        for name, text in value.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name[:64]!r} is not a valid variable name")
            if "\x00" in text:
                raise ValueError(f"the value of {name} contains a NUL byte")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_METADATA:
            raise ValueError(f"has more than {MAX_METADATA} entries")
        for key, text in value.items():
            if not key or len(key) > 128:
                raise ValueError("keys must be 1-128 characters")
            if len(text) > MAX_METADATA_VALUE:
                raise ValueError(f"the value of {key[:64]!r} is longer than {MAX_METADATA_VALUE} characters")
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[VolumeMount]) -> list[VolumeMount]:
        seen: set[str] = set()
        for i, mount in enumerate(value):
            if mount.path in seen:
                raise _FieldError((i, "path"), f"{mount.path} is mounted twice")
            seen.add(mount.path)
        return value

    @model_validator(mode="after")
    def _positive_request(self) -> EnvironmentSpec:
        # ENV-5: an Environment must ask for some CPU and memory; disk may be zero (no reservation).
        if self.resources.cpu_millis <= 0:
            raise _FieldError(("resources", "cpuMillis"), "must be positive")
        if self.resources.memory_bytes <= 0:
            raise _FieldError(("resources", "memoryBytes"), "must be positive")
        return self


class _FieldError(ValueError):
    """A model-level check that knows which field it is about."""

    def __init__(self, loc: tuple[str | int, ...], reason: str) -> None:
        super().__init__(reason)
        self.loc = loc
        self.reason = reason


M = TypeVar("M", bound=BaseModel)


def _camel(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    head, *rest = part.split("_")
    return head + "".join(word.title() for word in rest)


def field_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        text = _camel(part)
        out += text if text.startswith("[") or not out else f".{text}"
    return out


def parse_wire(model: type[M], data: Any, root: str = "") -> M:
    """Validate wire data (camelCase JSON) into ``model``; errors become InvalidInputError naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc: tuple[str | int, ...] = tuple(error["loc"])
        reason = error["msg"]
        ctx_error = (error.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _FieldError):
            loc, reason = loc + ctx_error.loc, ctx_error.reason
        elif error["type"] == "extra_forbidden":
            reason = "unknown field"
        elif reason.startswith("Value error, "):
            reason = reason.removeprefix("Value error, ")
        path = field_path(((root,) if root else ()) + loc)
        raise InvalidInputError(path, reason) from None

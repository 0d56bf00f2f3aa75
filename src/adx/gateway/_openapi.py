"""How the routes (API and Ingress) describe themselves in the OpenAPI document beyond their parameters.

Error answers: ``responses={404: error_answer("...")}``, an ``ErrorBody`` each. Request bodies, for the routes that
read or forward their body themselves rather than through a FastAPI parameter (so errors name the wire field,
``parse_wire``, or the bytes reach the node unread): ``openapi_extra=json_body(Model)`` or ``raw_body(...)``; the
app's document publishes every model of ``BODY_MODELS`` under its components."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adx.gateway._errors import ErrorBody

if TYPE_CHECKING:
    from pydantic import BaseModel

#: An OpenAPI object (JSON) FastAPI merges into an operation: its ``openapi_extra``, each of its ``responses``.
OpenApiObject = dict[str, Any]
#: An operation's error answers by HTTP status, as FastAPI's ``responses`` takes them.
OpenApiResponses = dict[int | str, OpenApiObject]


def error_answer(description: str) -> OpenApiObject:
    """An error answer of a route: an ``ErrorBody``, and when it is given."""
    return {"model": ErrorBody, "description": description}


#: The models of the request bodies those routes declare, by name (their components' names).
BODY_MODELS: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel], *, required: bool = True) -> OpenApiObject:
    """A JSON body of ``model``'s schema (published under components as ``model``'s name)."""
    BODY_MODELS[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def raw_body(description: str, *, required: bool = True) -> OpenApiObject:
    """A body of raw bytes (a file's content, a command's stdin), forwarded as it comes."""
    content = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    return {"requestBody": {"required": required, "description": description, "content": content}}

"""The wire format: our schema files against the SDK's own descriptors, the Connect protocol's error cases on a
real server, and the switch that turns the E2B API off."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import Sandbox
from google.protobuf import descriptor_pb2

import adx.e2b
from adx.api import ApiConfig, create_app

WIRE = Path(adx.e2b.__file__).parent / "wire"


def _compiled(name: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    import grpc_tools

    out = tmp_path / f"{name}.pb"
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{WIRE}", f"-I{include}", f"--descriptor_set_out={out}", name],
        check=True,
        capture_output=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return next(f for f in files if f.name == name)


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What goes on the wire: messages, fields (number, type, label, JSON name, oneof), enums, RPCs."""

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
        return {
            "fields": sorted(
                (
                    f.name,
                    f.number,
                    f.type,
                    f.type_name,
                    f.label,
                    f.json_name,
                    f.proto3_optional,
                    m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else "",
                )
                for f in m.field
            ),
            "nested": {n.name: message(n) for n in m.nested_type},
            "enums": {e.name: sorted((v.name, v.number) for v in e.value) for e in m.enum_type},
            "map": m.options.map_entry,
        }

    return {
        "package": file.package,
        "messages": {m.name: message(m) for m in file.message_type},
        "enums": {e.name: sorted((v.name, v.number) for v in e.value) for e in file.enum_type},
        "services": {
            s.name: sorted(
                (r.name, r.input_type, r.output_type, r.client_streaming, r.server_streaming) for r in s.method
            )
            for s in file.service
        },
    }


@pytest.mark.parametrize("name", ["process", "filesystem"])
def test_our_proto_files_describe_what_the_sdk_speaks(name: str, tmp_path: Path) -> None:
    sdk_module = {"process": "e2b.envd.process.process_pb", "filesystem": "e2b.envd.filesystem.filesystem_pb"}[name]
    sdk = descriptor_pb2.FileDescriptorProto.FromString(
        __import__(sdk_module, fromlist=["desc"]).desc().proto.to_binary()
    )
    assert _shape(_compiled(f"{name}.proto", tmp_path)) == _shape(sdk)


def test_control_schema_is_valid_json_schema() -> None:
    import jsonschema

    schema = json.loads((WIRE / "control.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    new_sandbox = {"$ref": "#/$defs/NewSandbox", "$defs": schema["$defs"]}
    jsonschema.validate({"templateID": "base", "timeout": 60, "metadata": {"a": "b"}}, new_sandbox)


def test_the_e2b_api_can_be_switched_off() -> None:
    def served(config: ApiConfig) -> tuple[bool, bool]:
        app = create_app(config)
        control = any(getattr(route, "original_router", None) is adx.e2b.router for route in app.routes)
        return control, any(m.cls is adx.e2b.EnvdDataPlane for m in app.user_middleware)

    assert served(ApiConfig()) == (True, True)
    assert served(ApiConfig(e2b=False)) == (False, False)
    assert served(ApiConfig(ingress=False)) == (True, False)


def _frame(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def _frames(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while body:
        flags, size = struct.unpack(">BI", body[:5])
        out.append((flags, json.loads(body[5 : 5 + size])))
        body = body[5 + size :]
    return out


@pytest.mark.slow
def test_unknown_rpc_is_a_connect_unimplemented_error(adx_up: Up) -> None:
    sandbox = Sandbox.create(**adx_up.opts())
    try:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
        with httpx.Client(base_url=adx_up.url, headers=headers, timeout=30) as http:
            for path in ("/process.Process/Fly", "/filesystem.Filesystem/Fly", "/nosuch.Service/Call"):
                unary = http.post(path, json={}, headers={"Content-Type": "application/json"})
                assert unary.status_code == 501, unary.text
                assert unary.json()["code"] == "unimplemented"
            streamed = http.post(
                "/process.Process/Fly", content=_frame({}), headers={"Content-Type": "application/connect+json"}
            )
            assert streamed.status_code == 200
            assert _frames(streamed.content) == [
                (2, {"error": {"code": "unimplemented", "message": streamed_message(streamed)}})
            ]
            # Not a crash: the same server and sandbox keep answering.
            assert http.get("/health").status_code == 204
            started = http.post(
                "/process.Process/Start",
                content=_frame({"process": {"cmd": "/bin/echo", "args": ["still", "here"]}}),
                headers={"Content-Type": "application/connect+json"},
            )
            events = [m for flags, m in _frames(started.content) if not flags]
            assert events[0]["event"]["start"]["pid"] > 0
            assert events[-1]["event"]["end"] == {"exitCode": 0, "exited": True, "status": "exit status 0"}
            # A wrong token is refused before any of that.
            refused = http.post("/process.Process/Fly", json={}, headers={"X-Access-Token": "e2b1.x.y"})
            assert (refused.status_code, refused.json()["code"]) == (401, "unauthenticated")
            refused_files = http.get("/files", params={"path": "/etc/hostname"}, headers={"X-Access-Token": ""})
            assert refused_files.status_code == 401
    finally:
        sandbox.kill()


@pytest.mark.slow
def test_a_request_message_of_the_wrong_shape_is_invalid_argument_naming_the_field(adx_up: Up) -> None:
    """envd's request messages are read as typed objects (adx.e2b._messages): a field of the wrong type or out of
    its range is Connect's invalid_argument naming the field, before anything reaches the sandbox."""
    sandbox = Sandbox.create(**adx_up.opts())
    try:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
        cases = [
            ("/process.Process/Start", {"process": {"cmd": "/bin/echo", "args": [1]}}, "process.args[0]"),
            ("/process.Process/Start", {"process": {"args": ["x"]}}, "process.cmd"),
            (
                "/process.Process/Start",
                {"process": {"cmd": "sh"}, "pty": {"size": {"rows": 0, "cols": 80}}},
                "pty.size.rows",
            ),
            ("/process.Process/SendSignal", {"process": {"pid": 1}, "signal": ["SIGKILL"]}, "signal"),
            ("/filesystem.Filesystem/ListDir", {"path": "/", "depth": 99}, "depth"),
            ("/filesystem.Filesystem/GetWatcherEvents", {}, "watcherId"),
            ("/filesystem.Filesystem/Stat", {"path": 5}, "path"),
        ]
        with httpx.Client(base_url=adx_up.url, headers=headers, timeout=30) as http:
            for path, message, field in cases:
                answer = http.post(path, json=message, headers={"Content-Type": "application/json"})
                assert answer.status_code == 400, (path, answer.text)
                assert answer.json()["code"] == "invalid_argument", (path, answer.text)
                assert answer.json()["message"].startswith(f"{field}: "), (path, answer.text)
    finally:
        sandbox.kill()


def streamed_message(response: httpx.Response) -> str:
    return str(_frames(response.content)[-1][1]["error"]["message"])


@pytest.mark.slow
def test_control_plane_errors_have_e2b_shape(adx_up: Up) -> None:
    with httpx.Client(base_url=adx_up.url, timeout=30) as http:
        unauthenticated = http.get("/v2/sandboxes", headers={"X-API-KEY": "adxk_nope"})
        assert unauthenticated.status_code == 401
        assert unauthenticated.json()["code"] == 401
        missing = http.get("/sandboxes/env-" + "a" * 26, headers={"X-API-KEY": adx_up.key})
        assert (missing.status_code, missing.json()["code"]) == (404, 404)
        invalid = http.post(
            "/v2/sandboxes", json={"templateID": "base", "timeout": -1}, headers={"X-API-KEY": adx_up.key}
        )
        assert (invalid.status_code, invalid.json()["code"]) == (400, 400)
        assert "timeout" in invalid.json()["message"]

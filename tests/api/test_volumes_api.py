"""Named volumes through ``/v1/volumes`` (docs/volumes.md): create, list, get, delete against a real API server
and Coordinator (Redis); an Environment's ``volumes`` must name the tenant's volumes (422 naming the field,
nothing stored); a volume an Environment mounts cannot be deleted (409 naming it) until that Environment is."""

from __future__ import annotations

from pathlib import Path

from apistack import ApiStack

SPEC = {"resources": {"cpuMillis": 500, "memoryBytes": 256 * 2**20}}


async def test_volume_lifecycle_and_mount_checks(api_stack, tmp_path: Path) -> None:
    stack: ApiStack = await api_stack(volumes_dir=tmp_path / "volumes")
    key, other = await stack.tenant("acme"), await stack.tenant("other")
    node = await stack.register_node("n1")
    async with stack.http(key) as http, stack.http(other) as them:
        made = await http.post("/v1/volumes", json={"name": "data"})
        assert made.status_code == 201, made.text
        volume = made.json()
        assert volume["id"].startswith("vol-") and volume["name"] == "data" and volume["createdAt"] > 0
        assert (tmp_path / "volumes" / "acme" / "data" / "data").is_dir()
        # Only root reaches a volume's files on the host; its data dir is E2B's `user`'s (uid 1000) inside.
        for private in (tmp_path / "volumes", tmp_path / "volumes" / "acme"):
            assert private.stat().st_mode & 0o777 == 0o700, private
        data_dir = (tmp_path / "volumes" / "acme" / "data" / "data").stat()
        assert (data_dir.st_uid, data_dir.st_gid, data_dir.st_mode & 0o777) == (1000, 1000, 0o755)
        taken = await http.post("/v1/volumes", json={"name": "data"})
        assert taken.status_code == 409 and taken.json()["error"]["details"]["field"] == "name"
        bad = await http.post("/v1/volumes", json={"name": "../x"})
        assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "name"
        assert [v["id"] for v in (await http.get("/v1/volumes")).json()["volumes"]] == [volume["id"]]
        assert (await http.get(f"/v1/volumes/{volume['id']}")).json() == volume
        # Another tenant: nothing to see, find or delete.
        assert (await them.get("/v1/volumes")).json()["volumes"] == []
        assert (await them.get(f"/v1/volumes/{volume['id']}")).status_code == 404
        assert (await them.delete(f"/v1/volumes/{volume['id']}")).status_code == 404
        unknown = await them.post("/v1/environments", json={**SPEC, "volumes": [{"name": "data", "path": "/d"}]})
        assert unknown.status_code == 422 and unknown.json()["error"]["details"]["field"] == "volumes[0].name"
        assert (await them.get("/v1/environments")).json()["environments"] == []  # nothing was stored
        for mounts, field in (
            ([{"name": "data", "path": "relative"}], "volumes[0].path"),
            ([{"name": "data", "path": "/sys/x"}], "volumes[0].path"),
            ([{"name": "data", "path": "/a"}, {"name": "data", "path": "/a/"}], "volumes[1].path"),
        ):
            refused = await http.post("/v1/environments", json={**SPEC, "volumes": mounts})
            assert refused.status_code == 422 and refused.json()["error"]["details"]["field"] == field, refused.text

        env = await http.post("/v1/environments", json={**SPEC, "volumes": [{"name": "data", "path": "/mnt/d"}]})
        assert env.status_code == 201, env.text
        assert env.json()["volumes"] == [{"name": "data", "path": "/mnt/d"}]
        in_use = await http.delete(f"/v1/volumes/{volume['id']}")
        assert in_use.status_code == 409 and env.json()["id"] in in_use.json()["error"]["message"]
        env_id = env.json()["id"]
        await stack.mark_running(node, env_id)
        assert (await http.delete(f"/v1/environments/{env_id}")).status_code in (200, 202)
        # Deleting: its sandbox may still have the volume mounted; deleted (the node's result): free.
        assert (await http.delete(f"/v1/volumes/{volume['id']}")).status_code == 409
        await stack.commit(node, env_id, {"state": "deleted"})
        gone = await http.delete(f"/v1/volumes/{volume['id']}")
        assert gone.status_code == 200, gone.text
        assert not (tmp_path / "volumes" / "acme" / "data").exists()
        assert (await http.get(f"/v1/volumes/{volume['id']}")).status_code == 404
        assert (await http.post("/v1/volumes", json={"name": "data"})).status_code == 201  # the name is free again


async def test_volume_routes_without_a_volumes_dir_are_503(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    async with stack.http(key) as http:
        answer = await http.get("/v1/volumes")
        assert answer.status_code == 503 and "volumes_dir" in answer.json()["error"]["message"]

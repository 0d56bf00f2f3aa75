"""Images on real sandboxes (issue 13): the Debian base image made by mmdebstrap, ``adx image build``'s layers,
an execd sandbox running as the image's ``user`` with sudo, and everything writable kept across pause/resume.

The Debian image is built once into a store that outlives the test session (``ADX_TEST_IMAGE_CACHE``, default
``/var/tmp/adx-test-images``): its layer is content-addressed, so a cached one is the very same tree a cold
build makes (bench/bench_images.py measures the cold build). Every other layer is built by the tests themselves.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from image_cache import CACHE, cached_debian_store
from sbx_helpers import Daemon, DaemonFactory
from test_runtime_control import execd_call, run

from adx.errors import ImageBuildError, InvalidInputError, UnavailableError
from adx.images import ImageStore
from adx.images._node_dist import NODE, NPM
from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RestoreRequest, SandboxdClient, SandboxRef, ref_of
from adx.sandboxd._image_build import build_image

HOST_ONLY = f"{Path(sys.executable).parent} {Path(__file__).parent}"  # pyenv's interpreter, this checkout
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def debian_store() -> ImageStore:
    return cached_debian_store()


def _execd_request(name: str, image: str, **kw: object) -> CreateRequest:
    return CreateRequest(
        request_id=f"{name}-{uuid.uuid4().hex[:8]}",
        image=image,
        argv=[],
        execd=ExecdOptions(execution_id=f"x-{name}"),
        resources=ResourcesSpec(cpu_millis=1000, memory_bytes=512 << 20),
        **kw,  # type: ignore[arg-type]
    )


def _daemon(sandboxd: DaemonFactory, name: str = "d1") -> Daemon:
    return sandboxd(name, images_dir=str(CACHE))


async def _start(c: SandboxdClient, name: str, image: str) -> tuple[SandboxRef, str]:
    """An execd sandbox of ``image``, serving: its ref and execd socket."""
    created = await c.create(_execd_request(name, image))
    socket = created.sandbox.execd_socket
    assert socket is not None
    await _exec_ready(socket)
    return ref_of(created), socket


async def _exec_ready(socket: str) -> None:
    async with asyncio.timeout(30):
        while True:
            try:
                if (await execd_call(socket, "GET", "/v1/health")).status_code == 200:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.05)


async def test_debian_image_runs_as_user_in_home_with_sudo_and_no_host_paths(
    sandboxd: DaemonFactory, debian_store: ImageStore
) -> None:
    d = _daemon(sandboxd)
    async with d.client() as c:
        ref, socket = await _start(c, "deb", "debian")
        out, code = await run(socket, "id -un; id -u; pwd; echo $HOME; sudo -n id -u; python --version; "
                              "node --version; git --version; pip --version; curl --version | head -1")  # fmt: skip
        assert code == 0, out
        lines = out.splitlines()
        assert lines[:5] == ["user", "1000", "/home/user", "/home/user", "0"], out
        assert lines[5].startswith("Python 3.11") and lines[6] == f"v{NODE.version}"
        # Nothing of the host: its pyenv interpreter and the repository are not there.
        out, code = await run(socket, f"ls {HOST_ONLY} 2>&1; true")
        assert "No such file" in out, out
        await c.delete(ref)


async def test_debian_node_is_the_pinned_upstream_build_and_sudo_npm_installs_globally(
    sandboxd: DaemonFactory, debian_store: ImageStore
) -> None:
    """Issue 16: the image's node is upstream's self-contained build (not Debian's ``nodejs``, which links libnode
    and ICU), with npm and npx; ``sudo npm install -g`` of a package packed in the sandbox (no network) puts its
    command on ``user``'s PATH."""
    d = _daemon(sandboxd)
    pkg = (
        "mkdir -p /tmp/hello && cd /tmp/hello && "
        """printf '{"name":"adx-hello","version":"1.0.0","bin":{"adx-hello":"cli.js"}}' > package.json && """
        """printf '#!/usr/bin/env node\\nconsole.log("hello from " + process.version)\\n' > cli.js && """
        "npm pack --silent"
    )
    async with d.client() as c:
        ref, socket = await _start(c, "npm", "debian")
        out, code = await run(
            socket,
            "for t in node npm npx; do command -v $t; done; node -v; npm -v; npx -v; sudo -n node -v; "
            "dpkg -s nodejs 2>&1 | head -1; "
            "ldd /usr/local/bin/node | grep -c -e libnode -e libicu; true",
        )
        assert code == 0, out
        lines = out.splitlines()
        assert lines[:3] == ["/usr/local/bin/node", "/usr/local/bin/npm", "/usr/local/bin/npx"], out
        assert lines[3:7] == [f"v{NODE.version}", NPM.version, NPM.version, f"v{NODE.version}"], out
        assert "not installed" in lines[7] and lines[8] == "0", out
        out, code = await run(
            socket,
            f"{pkg} && sudo -n npm install -g --offline --no-audit --no-fund /tmp/hello/adx-hello-1.0.0.tgz "
            ">/tmp/npm.log 2>&1 || cat /tmp/npm.log; command -v adx-hello && adx-hello",
        )
        assert code == 0, out
        assert out.splitlines()[-2:] == ["/usr/local/bin/adx-hello", f"hello from v{NODE.version}"], out
        await c.delete(ref)


async def test_unknown_image_is_refused_naming_the_field(sandboxd: DaemonFactory, debian_store: ImageStore) -> None:
    d = _daemon(sandboxd)
    async with d.client() as c:
        with pytest.raises(InvalidInputError) as info:
            await c.create(_execd_request("nope", "no-such-image"))
        assert info.value.field == "image" and "no-such-image" in str(info.value)


DOCKERFILE = """\
FROM debian
ARG GREETING=hello
RUN echo "$GREETING from step one" > /etc/step-one && useradd -m agent
COPY files/ /opt/app/
RUN {last}
"""


async def _build(c: SandboxdClient, store: ImageStore, ctx: Path, name: str, last: str) -> list[str]:
    (ctx / "files").mkdir(exist_ok=True)
    (ctx / "files" / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    result = await build_image(c, store, DOCKERFILE.format(last=last), name, context=ctx)
    return [s.status for s in result.steps]


async def test_three_step_dockerfile_builds_and_a_changed_last_step_rebuilds_only_it(
    sandboxd: DaemonFactory, debian_store: ImageStore, tmp_path: Path
) -> None:
    d = _daemon(sandboxd)
    tag = uuid.uuid4().hex[:8]  # steps unseen by the shared store: the first build really builds them
    async with d.client() as c:
        statuses = await _build(c, debian_store, tmp_path, f"t3-{tag}", f"echo {tag} > /opt/app/marker")
        assert statuses == ["config", "config", "built", "built", "built"]
        first = debian_store.get(f"t3-{tag}")
        statuses = await _build(c, debian_store, tmp_path, f"t3-{tag}", f"echo {tag}-changed > /opt/app/marker")
        assert statuses == ["config", "config", "cached", "cached", "built"]
        second = debian_store.get(f"t3-{tag}")
        assert second.layers[:-1] == first.layers[:-1] and second.layers[-1] != first.layers[-1]
        statuses = await _build(c, debian_store, tmp_path, f"t3-{tag}", f"echo {tag}-changed > /opt/app/marker")
        assert statuses == ["config", "config", "cached", "cached", "cached"]
        # The image works: every step's files, as the image's user.
        ref, socket = await _start(c, "t3", f"t3-{tag}")
        out, code = await run(socket, "cat /etc/step-one /opt/app/marker; sh /opt/app/tool.sh; id -un agent")
        assert (code, out) == (0, f"hello from step one\n{tag}-changed\ntool ran\nagent\n")
        await c.delete(ref)
        # rm while a sandbox used it is refused; once it is gone the image and its own layers go.
        debian_store.rm(f"t3-{tag}")
        assert not debian_store.has_layer(second.layers[-1]) and debian_store.has_layer(second.layers[0])


async def test_a_failing_step_reports_its_line_and_output_and_keeps_the_old_manifest(
    sandboxd: DaemonFactory, debian_store: ImageStore, tmp_path: Path
) -> None:
    d = _daemon(sandboxd)
    async with d.client() as c:
        with pytest.raises(ImageBuildError) as info:
            await build_image(
                c, debian_store, "FROM debian\nRUN echo to-stderr >&2; exit 3\n", "failing", context=tmp_path
            )
        assert info.value.details["line"] == 2 and "to-stderr" in str(info.value) and "exit code 3" in str(info.value)
        assert debian_store.find("failing") is None
        assert not [s for s in await c.list() if s.state != "deleted"]  # the step's sandbox is gone


def _make_deb(tmp: Path) -> Path:
    pkg = tmp / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr/bin").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text(
        "Package: adx-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: adx <adx@localhost>\n"
        "Description: test package\n"
    )
    tool = pkg / "usr/bin/adx-hello"
    tool.write_text("#!/bin/sh\necho hello from a deb\n")
    tool.chmod(0o755)
    out = tmp / "adx-hello_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(out)], check=True, capture_output=True)
    return out


async def _pause(c: SandboxdClient, ref: SandboxRef) -> tuple[str, str]:
    await c.pause(ref)
    ck = await c.checkpoint(ref, leave_running=True)
    await c.delete(ref)
    return ck.location, ck.digest


async def test_files_everywhere_and_an_apt_installed_deb_survive_three_pause_resume_cycles(
    sandboxd: DaemonFactory, debian_store: ImageStore, tmp_path: Path
) -> None:
    deb = _make_deb(tmp_path)
    d = _daemon(sandboxd)
    async with d.client() as c:
        ref, socket = await _start(c, "keep", "debian")
        resp = await execd_call(socket, "PUT", "/v1/files", params={"path": "/tmp/pkg.deb"}, content=deb.read_bytes())
        assert resp.status_code in (200, 201, 204), resp.text
        out, code = await run(socket, "sudo -n apt-get install -y /tmp/pkg.deb 2>&1 | tail -3; adx-hello")
        assert code == 0 and "hello from a deb" in out, out
        for cycle in range(1, 4):
            write = (
                f"echo c{cycle} > /tmp/c{cycle} && echo c{cycle} > /home/user/c{cycle} && "
                f"echo c{cycle} | sudo -n tee /etc/c{cycle} /root/c{cycle} >/dev/null && "
                f"sudo -n sh -c 'echo c{cycle} > /work/c{cycle}'"
            )
            out, code = await run(socket, write)
            assert code == 0, out
            location, digest = await _pause(c, ref)
            restored = await c.restore(
                RestoreRequest(request_id=f"r{cycle}-{uuid.uuid4().hex[:6]}", location=location, digest=digest)
            )
            ref = ref_of(restored)
            socket = restored.sandbox.execd_socket
            assert socket is not None
            await _exec_ready(socket)
            check = " ".join(f"/tmp/c{i} /home/user/c{i} /etc/c{i} /work/c{i}" for i in range(1, cycle + 1))
            roots = " ".join(f"/root/c{i}" for i in range(1, cycle + 1))
            out, code = await run(
                socket, f"cat {check} && sudo -n cat {roots} && adx-hello && dpkg -s adx-hello | grep Status && id -un"
            )
            cycles = range(1, cycle + 1)
            expected = "".join(f"c{i}\n" * 4 for i in cycles) + "".join(f"c{i}\n" for i in cycles)
            assert code == 0, out
            assert out == expected + "hello from a deb\nStatus: install ok installed\nuser\n", out
        await c.delete(ref)


async def test_base_image_debian_makes_the_default_image_debian(
    sandboxd: DaemonFactory, debian_store: ImageStore
) -> None:
    """``base_image = "debian"``: an Environment that names no image (or ``base``) gets the Debian image."""
    d = sandboxd("d1", images_dir=str(CACHE), base_image="debian")
    async with d.client() as c:
        async with asyncio.timeout(60):  # the store has the layer: the builder only writes the 'base' manifest
            while True:
                try:
                    created = await c.create(_execd_request("dflt", "base"))
                    break
                except UnavailableError:
                    await asyncio.sleep(0.2)
        socket = created.sandbox.execd_socket
        assert socket is not None
        await _exec_ready(socket)
        out, code = await run(socket, "id -un; pwd; cat /etc/debian_version")
        assert code == 0 and out.startswith("user\n/home/user\n12."), out
        await c.delete(ref_of(created))
    assert debian_store.get("base").layers == debian_store.get("debian").layers


def _adx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adx", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )


async def test_adx_image_build_list_rm_commands(
    sandboxd: DaemonFactory, debian_store: ImageStore, tmp_path: Path
) -> None:
    """The CLI on a running sandboxd (its --config names the socket and the store): build shows each step and
    whether it was cached, list shows the image, rm removes it."""
    d = _daemon(sandboxd)
    tag = uuid.uuid4().hex[:8]
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM debian\nENV TAG={tag}\nRUN echo $TAG > /etc/tag\n")
    name = f"cli-{tag}"
    first = await asyncio.to_thread(_adx, "image", "build", "-f", str(dockerfile), name, "--config", str(d.config_path))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[3/3]" in first.stdout and "built" in first.stdout and "1 steps built, 0 cached" in first.stdout
    again = await asyncio.to_thread(_adx, "image", "build", "-f", str(dockerfile), name, "--config", str(d.config_path))
    assert again.returncode == 0 and "0 steps built, 1 cached" in again.stdout, again.stdout
    listed = await asyncio.to_thread(_adx, "image", "list", "--config", str(d.config_path))
    assert listed.returncode == 0 and name in listed.stdout and "debian" in listed.stdout, listed.stdout
    bad = tmp_path / "Bad"
    bad.write_text("FROM debian\nEXPOSE 80\n")
    refused = await asyncio.to_thread(_adx, "image", "build", "-f", str(bad), "x", "--config", str(d.config_path))
    assert refused.returncode == 2 and "line 2" in refused.stdout + refused.stderr
    removed = await asyncio.to_thread(_adx, "image", "rm", name, "--config", str(d.config_path))
    assert removed.returncode == 0 and debian_store.find(name) is None, removed.stdout + removed.stderr

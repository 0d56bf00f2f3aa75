"""The image store and the Dockerfile parser (no sandbox needed: the store is directories and renames)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adx.errors import ConflictError, InvalidInputError, NotFoundError
from adx.images import POOL_HOLDER_PREFIX, ImageManifest, ImageStore, Op, layer_digest, parse_dockerfile


def _layer(store: ImageStore, parent: str | None, step: str, files: dict[str, str]) -> str:
    digest = layer_digest(parent, step)
    staging = store.staging()
    for rel, text in files.items():
        (staging / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / "tree" / rel).write_text(text)
    store.commit_layer(staging, digest, parent, step)
    return digest


def test_layers_are_content_addressed_and_a_second_commit_of_one_digest_keeps_the_first(tmp_path: Path) -> None:
    store = ImageStore(tmp_path).ensure()
    a = _layer(store, None, "RUN a", {"etc/a": "1"})
    assert a == layer_digest(None, "RUN a") != layer_digest(a, "RUN a") != layer_digest(None, "RUN a", "content")
    again = _layer(store, None, "RUN a", {"etc/a": "other"})
    assert again == a and (store.layer_tree(a) / "etc/a").read_text() == "1"
    assert not [p for p in store.layers_dir.iterdir() if p.name.startswith(".tmp-")]  # staging dropped
    info = store.layer_info(a)
    assert info.step == "RUN a" and info.parent is None and info.size_bytes > 0


def test_manifest_round_trip_lowerdir_order_and_unknown_names(tmp_path: Path) -> None:
    store = ImageStore(tmp_path).ensure()
    a = _layer(store, None, "RUN a", {"a": "1"})
    b = _layer(store, a, "RUN b", {"b": "2"})
    store.put(ImageManifest(name="img", layers=[a, b], env={"X": "1"}, workdir="/w", user="user"))
    got = store.get("img")
    assert (got.layers, got.env, got.workdir, got.user) == ([a, b], {"X": "1"}, "/w", "user")
    # overlayfs takes the topmost layer first.
    assert store.lowerdir_of(got.layers) == f"{store.layer_tree(b)}:{store.layer_tree(a)}"
    with pytest.raises(NotFoundError) as info:
        store.get("missing")
    assert info.value.details["field"] == "image"
    with pytest.raises(InvalidInputError):
        store.get("Bad/Name")
    with pytest.raises(InvalidInputError):
        store.put(ImageManifest(name="dangling", layers=["0" * 64]))


def test_rm_refuses_an_image_a_live_sandbox_holds_and_gc_keeps_shared_layers(tmp_path: Path) -> None:
    store = ImageStore(tmp_path).ensure()
    a = _layer(store, None, "RUN a", {"a": "1"})
    b = _layer(store, a, "RUN b", {"b": "2"})
    c = _layer(store, a, "RUN c", {"c": "3"})
    orphan = _layer(store, None, "RUN orphan", {"o": "4"})
    store.put(ImageManifest(name="one", layers=[a, b]))
    store.put(ImageManifest(name="two", layers=[a, c]))
    store.hold("sb-1", [a, b])
    with pytest.raises(ConflictError) as info:
        store.rm("one")
    assert info.value.details["sandboxes"] == ["sb-1"] and store.find("one") is not None
    # --force: the name goes, its layers stay while the sandbox holds them.
    assert store.rm("one", force=True) == [orphan]
    assert store.has_layer(b) and store.find("one") is None
    store.release("sb-1")
    assert store.gc() == [b]
    assert store.has_layer(a) and store.has_layer(c)  # still image two's
    store.hold("sb-gone", [c])
    store.release_all_but({"sb-other"})
    assert store.held_layers() == set()


def test_rm_is_not_refused_by_warm_pool_members_whose_layers_stay_held(tmp_path: Path) -> None:
    """sandboxd's warm members (holders named POOL_HOLDER_PREFIX...) pre-start sandboxes of recently used images:
    deleting such an image (an E2B template after its sandbox was killed) must not answer 409 naming them."""
    store = ImageStore(tmp_path).ensure()
    a = _layer(store, None, "RUN a", {"a": "1"})
    store.put(ImageManifest(name="tpl", layers=[a]))
    store.hold(f"{POOL_HOLDER_PREFIX}0123456789abcdef", [a])
    assert store.rm("tpl") == [] and store.find("tpl") is None
    assert store.has_layer(a)  # held by the member until the pool drops it
    store.release(f"{POOL_HOLDER_PREFIX}0123456789abcdef")
    assert store.gc() == [a]


def test_commit_tree_moves_whiteouts_and_opaque_dirs_as_they_are(tmp_path: Path) -> None:
    """An overlay upper dir's deletions (0/0 char devices) and opaque dirs (xattr) keep their meaning as a lower."""
    store = ImageStore(tmp_path / "store").ensure()
    upper = tmp_path / "upper"
    (upper / "opaque").mkdir(parents=True)
    os.setxattr(upper / "opaque", "trusted.overlay.opaque", b"y")
    os.mknod(upper / "deleted", 0o600 | 0o020000, os.makedev(0, 0))
    digest = layer_digest(None, "RUN rm")
    store.commit_tree(upper, digest, None, "RUN rm")
    tree = store.layer_tree(digest)
    assert os.getxattr(tree / "opaque", "trusted.overlay.opaque") == b"y"
    st = os.lstat(tree / "deleted")
    assert os.major(st.st_rdev) == 0 and os.minor(st.st_rdev) == 0 and not upper.exists()


def test_dockerfile_subset_parses_and_refuses_the_rest_with_its_line() -> None:
    steps = parse_dockerfile(
        '# comment\nARG BASE=debian\nFROM $BASE\nENV A=1 B="two words"\nENV C 3\nWORKDIR /app\n'
        'RUN apt-get update && \\\n    apt-get install -y x\nRUN ["echo", "hi"]\nCOPY a b /dst/\nUSER user\nARG V\n'
    )
    assert [s.op for s in steps] == [
        Op.ARG,
        Op.FROM,
        Op.ENV,
        Op.ENV,
        Op.WORKDIR,
        Op.RUN,
        Op.RUN,
        Op.COPY,
        Op.USER,
        Op.ARG,
    ]
    assert steps[2].args == ("A", "1", "B", "two words") and steps[3].args == ("C", "3")
    assert steps[5].shell and steps[5].args == ("apt-get update && apt-get install -y x",) and steps[5].line == 7
    assert not steps[6].shell and steps[6].args == ("echo", "hi")
    for bad, line in (
        ("FROM x\nEXPOSE 80\n", 2),
        ("RUN x\n", 1),
        ("FROM a\nFROM b\n", 2),
        ("FROM x\nCOPY --from=a b c\n", 2),
    ):
        with pytest.raises(InvalidInputError) as info:
            parse_dockerfile(bad)
        assert info.value.field == "dockerfile" and info.value.details["line"] == line

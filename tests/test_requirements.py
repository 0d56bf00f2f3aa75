"""The requirement list in the repository (docs/requirements.md) agrees with the code and the tests.

- Every requirement ID cited anywhere in ``src/`` or ``tests/`` is listed: a typo or an invented ID fails,
  naming the file and the line.
- Every listed ID is named by at least one test, unless its line is tagged ``(not yet proven by a test)``; and a
  tagged ID that a test does name must lose its tag, so the list of gaps can only shrink.

Cited forms: ``NOD-13``, a range ``JRN-1..8`` and a shorthand ``NOD-10/11`` (both of the same family); in a test
function's name also ``nod_13``. A test *names* an ID when the ID is in its ``req`` marker (on the function, its
class or the module's ``pytestmark``), its name, its docstring or its body (a comment or a string in it). A module
docstring that lists IDs for a whole file names no test and does not count.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "docs" / "requirements.md"
SCANNED = (ROOT / "src", ROOT / "tests")
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".proto", ".toml", ".txt", ".json", ".sql", ".sh", ".cfg", ".ini"}
UNPROVEN_TAG = "(not yet proven by a test)"
# Uppercase-dash-number tokens that are not requirement IDs (UTF-8, SHA-256, ...). Add here, not to the list.
NOT_REQUIREMENTS = frozenset({"UTF", "SHA", "RFC", "ISO", "PEP", "CVE", "AES", "RSA", "TLS", "HTTP", "IPV", "CRC"})

_CITATION = re.compile(r"(?<![A-Za-z0-9_])([A-Z]{2,5})-(\d+)((?:/\d+)+|\.\.\d+)?(?![0-9])")
_ENTRY = re.compile(r"^- \*\*([A-Z]{2,5})-(\d+)\*\* (\S.*)$")
_FAMILY = re.compile(r"^## ([A-Z]{2,5}): \S")


@dataclass(frozen=True)
class Requirement:
    id: str
    family: str
    line: int
    unproven: bool


def parse_requirements(text: str) -> dict[str, Requirement]:
    """ID -> its entry. Entries are ``- **FAM-N** gist``, under a ``## FAM: title`` heading of their family."""
    found: dict[str, Requirement] = {}
    problems: list[str] = []
    family: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if heading := _FAMILY.match(line):
            family = heading.group(1)
            continue
        if not line.startswith("- **"):
            continue
        entry = _ENTRY.match(line)
        if entry is None:
            problems.append(f"requirements.md:{number}: not an entry of the form '- **FAM-N** gist': {line[:60]!r}")
            continue
        req_id = f"{entry.group(1)}-{int(entry.group(2))}"
        if entry.group(1) != family:
            problems.append(f"requirements.md:{number}: {req_id} is listed under the {family} heading")
        if req_id in found:
            problems.append(f"requirements.md:{number}: {req_id} is listed twice (first at line {found[req_id].line})")
        found[req_id] = Requirement(req_id, entry.group(1), number, UNPROVEN_TAG in entry.group(3))
    assert not problems, "\n".join(problems)
    return found


def cited_ids(text: str) -> Iterator[tuple[str, str]]:
    """(ID, the text that cited it) for every citation in ``text``; ranges and shorthands are expanded."""
    for match in _CITATION.finditer(text):
        family, first, tail = match.group(1), int(match.group(2)), match.group(3)
        if family in NOT_REQUIREMENTS:
            continue
        if tail is None:
            numbers = [first]
        elif tail.startswith(".."):
            numbers = list(range(first, int(tail[2:]) + 1)) or [first, int(tail[2:])]
        else:
            numbers = [first, *(int(n) for n in tail[1:].split("/"))]
        for number in numbers:
            yield f"{family}-{number}", match.group(0)


def ids_in_test_name(name: str, families: Iterable[str]) -> set[str]:
    """``test_nod_13_orphans`` names NOD-13 (only for known families: a name is not a free-text citation)."""
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(sorted(families)) + r")_(\d+)(?![0-9])", re.IGNORECASE)
    return {f"{m.group(1).upper()}-{int(m.group(2))}" for m in pattern.finditer(name)}


def scanned_files() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted(top.rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def is_test_module(path: Path) -> bool:
    return path.suffix == ".py" and (path.name.startswith("test_") or path.name.endswith("_test.py"))


def ids_named_by_the_tests_in(path: Path, families: Iterable[str], root: Path = ROOT) -> dict[str, set[str]]:
    """ID -> the tests of one test module that name it (see the module docstring for what counts)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    families = list(families)

    def span(node: ast.AST) -> str:
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign)
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        last = node.end_lineno or node.lineno
        if isinstance(node, ast.ClassDef):  # the class's decorators, header and docstring, not its methods
            body0 = node.body[0]
            docstring = isinstance(body0, ast.Expr) and isinstance(body0.value, ast.Constant)
            last = (body0.end_lineno or body0.lineno) if docstring else node.lineno
        return "\n".join(lines[first - 1 : last])

    module_marks = "\n".join(
        span(node)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    )
    named: dict[str, set[str]] = {}

    def visit(body: list[ast.stmt], inherited: str, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                visit(node.body, inherited + "\n" + span(node), f"{prefix}{node.name}::")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids = {req_id for req_id, _ in cited_ids(span(node) + "\n" + inherited)}
                for req_id in ids | ids_in_test_name(node.name, families):
                    named.setdefault(req_id, set()).add(f"{path.relative_to(root)}::{prefix}{node.name}")

    visit(tree.body, module_marks, "")
    return named


@pytest.fixture(scope="module")
def requirements() -> dict[str, Requirement]:
    return parse_requirements(REQUIREMENTS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def named_by_tests(requirements: dict[str, Requirement]) -> dict[str, set[str]]:
    families = {r.family for r in requirements.values()}
    named: dict[str, set[str]] = {}
    for path in scanned_files():
        # This module's own examples name no requirement.
        if path.is_relative_to(ROOT / "tests") and is_test_module(path) and path != Path(__file__).resolve():
            for req_id, tests in ids_named_by_the_tests_in(path, families).items():
                named.setdefault(req_id, set()).update(tests)
    return named


def test_the_list_is_complete_and_well_formed(requirements: dict[str, Requirement]) -> None:
    families = {r.family for r in requirements.values()}
    assert families == {"ENV", "IDLE", "RST", "CTL", "MET", "CRD", "NOD", "RES", "JRN", "SBX", "AGT", "SEC"}
    for family in families:  # numbered 1..n in each family, no hole: a hole is a lost requirement
        numbers = sorted(int(r.id.split("-")[1]) for r in requirements.values() if r.family == family)
        assert numbers == list(range(1, len(numbers) + 1)), (family, numbers)
    assert len(requirements) == 119, "the list mirrors SPEC.md's 119 requirements: add or drop them together"


def test_every_cited_id_is_listed(requirements: dict[str, Requirement]) -> None:
    unknown: list[str] = []
    citations = 0
    families = {r.family for r in requirements.values()}
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            for req_id, cited_as in cited_ids(line):
                citations += 1
                if req_id not in requirements:
                    unknown.append(f"{path.relative_to(ROOT)}:{number}: {req_id} (cited as {cited_as!r})")
        if is_test_module(path):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                    for req_id in ids_in_test_name(node.name, families) - requirements.keys():
                        unknown.append(f"{path.relative_to(ROOT)}:{node.lineno}: {req_id} (in the name {node.name})")
    assert citations > 500, f"only {citations} citations found: is the scanner still reading src/ and tests/?"
    assert not unknown, "IDs not defined in docs/requirements.md:\n" + "\n".join(unknown)


def test_every_listed_id_is_named_by_a_test_or_tagged_unproven(
    requirements: dict[str, Requirement], named_by_tests: dict[str, set[str]]
) -> None:
    unnamed = [r for r in requirements.values() if not r.unproven and r.id not in named_by_tests]
    stale_tags = [r for r in requirements.values() if r.unproven and r.id in named_by_tests]
    problems = [
        f"requirements.md:{r.line}: {r.id} is named by no test: name it in the test that proves it, "
        f"or tag its line {UNPROVEN_TAG}"
        for r in unnamed
    ] + [
        f"requirements.md:{r.line}: {r.id} is tagged {UNPROVEN_TAG} but "
        f"{', '.join(sorted(named_by_tests[r.id]))} names it: remove the tag"
        for r in stale_tags
    ]
    assert not problems, "\n".join(problems)


def test_the_checker_recognises_every_form_of_citation(tmp_path: Path) -> None:
    """The checks above would pass vacuously if the scanner saw nothing: it is run on a module of every form."""
    invented = "NOD" + "-99"  # spelled apart so that this file cites no invented ID
    module = tmp_path / "test_forms.py"
    module.write_text(
        '"""Module docstring: IDLE-1..5 names no test."""\n'
        "import pytest\n"
        'pytestmark = pytest.mark.req("SEC-5")\n'
        '@pytest.mark.req("RST-4")\n'
        "def test_marker() -> None: ...\n"
        "def test_docstring() -> None:\n"
        '    """JRN-3/4 and AGT-2..4 in a docstring."""\n'
        "def test_comment() -> None:\n"
        f"    pass  # {invented} in a comment\n"
        "def test_nod_13_in_the_name() -> None: ...\n"
        "class TestGroup:\n"
        '    """CRD-8: a class docstring names each of its tests."""\n'
        "    def test_inner(self) -> None: ...\n"
        "def helper() -> None:\n"
        '    """ENV-5: not a test."""\n',
        encoding="utf-8",
    )
    named = ids_named_by_the_tests_in(module, ["NOD", "SEC"], root=tmp_path)
    assert named == {
        "SEC-5": {
            "test_forms.py::test_marker",
            "test_forms.py::test_docstring",
            "test_forms.py::test_comment",
            "test_forms.py::test_nod_13_in_the_name",
            "test_forms.py::TestGroup::test_inner",
        },
        "RST-4": {"test_forms.py::test_marker"},
        "JRN-3": {"test_forms.py::test_docstring"},
        "JRN-4": {"test_forms.py::test_docstring"},
        "AGT-2": {"test_forms.py::test_docstring"},
        "AGT-3": {"test_forms.py::test_docstring"},
        "AGT-4": {"test_forms.py::test_docstring"},
        invented: {"test_forms.py::test_comment"},
        "NOD-13": {"test_forms.py::test_nod_13_in_the_name"},
        "CRD-8": {"test_forms.py::TestGroup::test_inner"},
    }, named
    assert {"IDLE-1", "ENV-5"}.isdisjoint(named), "a module docstring or a helper names no test"
    assert dict(cited_ids("UTF-8 and SHA-256, then NOD-10/11 and MET-1..2")) == {
        "NOD-10": "NOD-10/11",
        "NOD-11": "NOD-10/11",
        "MET-1": "MET-1..2",
        "MET-2": "MET-1..2",
    }
    listed = parse_requirements("## NOD: x\n- **NOD-1** gist\n- **NOD-2** gist *(not yet proven by a test)*\n")
    assert [(r.id, r.unproven) for r in listed.values()] == [("NOD-1", False), ("NOD-2", True)]
    with pytest.raises(AssertionError, match="listed twice"):
        parse_requirements("## NOD: x\n- **NOD-1** a\n- **NOD-1** b\n")
    with pytest.raises(AssertionError, match="under the NOD heading"):
        parse_requirements("## NOD: x\n- **RES-1** a\n")

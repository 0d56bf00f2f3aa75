"""execd's options are defined once (``adx.execd._options``): every field round-trips through the argv that
sandboxd and ``adx execd`` write, on the fast path and through argparse alike."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adx.execd._config import ExecdConfig, ProbeConfig, to_options
from adx.execd._launch import init_argv
from adx.execd._options import CLI, ExecdOptions, _parse_plain, build_parser, parse_argv, to_argv
from adx.sandboxd import ExecdOptions as SandboxdExecdOptions
from adx.sandboxd import ProbeOptions

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_optional_text = st.none() | _text.filter(bool)
_seconds = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)

#: One strategy per field: a new field without one fails test_every_field_has_a_strategy.
FIELDS = {
    "socket": st.none(),  # exactly one of socket / socket_fd: set below
    "socket_fd": st.none(),
    "admin_socket": _optional_text,
    "admin_socket_fd": st.none(),
    "control_socket": _optional_text,
    "sandbox_id": _text,
    "execution_id": _optional_text,
    "socket_mode": st.integers(0, 0o7777),
    "workload": st.lists(_text, max_size=4).map(tuple),
    "workload_cwd": _optional_text,
    "user": _optional_text,
    "exit_with_workload": st.booleans(),
    "probe_command": _optional_text,
    "probe_tcp_port": st.none(),
    "probe_interval": _seconds,
    "probe_timeout": _seconds,
    "grace_seconds": st.floats(min_value=0, max_value=3600),
    "ring_bytes": st.integers(1024, 1 << 30),
    "coalesce_seconds": st.floats(min_value=0, max_value=60),
    "unset_env": st.lists(_text, max_size=3).map(tuple),
    "body_idle_timeout": _seconds,
    "write_timeout": _seconds,
    "log_level": st.sampled_from(["debug", "info", "warning", "error"]),
    "log_format": st.sampled_from(["kv", "json"]),
}


@st.composite
def options(draw: st.DrawFn) -> ExecdOptions:
    values = {name: draw(strategy) for name, strategy in FIELDS.items()}
    if draw(st.booleans()):
        values["socket_fd"] = draw(st.integers(0, 1 << 20))
    else:
        values["socket"] = draw(_text.filter(bool))
    if values["admin_socket"] is None and draw(st.booleans()):
        values["admin_socket_fd"] = draw(st.integers(0, 1 << 20))
    if values["probe_command"] is None and draw(st.booleans()):
        values["probe_tcp_port"] = draw(st.integers(1, 65535))
    return ExecdOptions(**values)


@pytest.fixture(autouse=True)
def _no_log_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser's log defaults come from the environment (as in a sandbox): pin them.
    monkeypatch.delenv("ADX_LOG_LEVEL", raising=False)
    monkeypatch.delenv("ADX_LOG_FORMAT", raising=False)


def test_every_field_has_an_option_and_a_strategy() -> None:
    assert sorted(o.field for o in CLI) == sorted(f for f in ExecdOptions._fields if f != "workload")
    assert set(FIELDS) == set(ExecdOptions._fields)
    assert len({o.flag for o in CLI}) == len(CLI)


@settings(max_examples=300, deadline=None)
@given(options())
def test_every_option_round_trips_through_argv(opts: ExecdOptions) -> None:
    argv = to_argv(opts)
    assert parse_argv(argv) == opts
    # argparse (help, errors, --option=value) reads the same table: same result on the same argv
    parsed = vars(build_parser().parse_args(argv))
    workload = parsed.pop("workload")
    assert tuple(workload[1:] if workload[:1] == ["--"] else workload) == opts.workload
    assert ExecdOptions(**{**parsed, "unset_env": tuple(parsed["unset_env"]), "workload": opts.workload}) == opts


def test_each_field_changed_alone_is_written_and_read_back() -> None:
    base = ExecdOptions(socket="/s")
    changed = {
        "admin_socket": "/a",
        "control_socket": "/c",
        "sandbox_id": "sbx",
        "execution_id": "x1",
        "socket_mode": 0o640,
        "workload": ("sh", "-c", "exit 3"),
        "workload_cwd": "/w",
        "user": "nobody",
        "exit_with_workload": False,
        "probe_command": "true",
        "probe_interval": 0.5,
        "probe_timeout": 0.25,
        "grace_seconds": 1.5,
        "ring_bytes": 4096,
        "coalesce_seconds": 0.2,
        "unset_env": ("PYTHONPATH", "X"),
        "body_idle_timeout": 7.0,
        "write_timeout": 9.0,
        "log_level": "debug",
        "log_format": "json",
    }
    for name, value in changed.items():
        opts = base._replace(**{name: value})
        argv = to_argv(opts)
        assert argv != to_argv(base), name
        assert _parse_plain(argv) is not None, f"{name}: the fast path reads what to_argv writes"
        assert parse_argv(argv) == opts, name
    assert parse_argv(to_argv(ExecdOptions(socket_fd=3, admin_socket_fd=4, probe_tcp_port=80))).probe_tcp_port == 80


def test_the_fast_path_does_not_import_argparse() -> None:
    argv = init_argv(ExecdOptions(socket_fd=3, sandbox_id="s", workload=("true",), unset_env=("PYTHONPATH",)))
    code = (
        "import sys\nfrom adx.execd._options import parse_argv\n"
        f"print(parse_argv({argv[3:]!r}).sandbox_id, 'argparse' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split() == ["s", "False"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give exactly one of --socket and --socket-fd"),
        (["--socket", "/s", "--socket-fd", "3"], "give exactly one of --socket and --socket-fd"),
        (["--socket", "/s", "--admin-socket", "/a", "--admin-socket-fd", "4"], "mutually exclusive"),
        (["--socket", "/s", "--probe-command", "true", "--probe-tcp-port", "1"], "mutually exclusive"),
        (["--socket", "/s", "--probe-tcp-port", "70000"], "must be in 1..65535"),
        (["--socket", "/s", "--probe-interval", "0"], "must be > 0"),
        (["--socket", "/s", "--socket-mode", "9"], "octal mode"),
        (["--socket", "/s", "--log-format", "xml"], "invalid choice"),
    ],
)
def test_bad_argv_is_a_usage_error_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_argv(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_config_file_reaches_every_option_it_has() -> None:
    cfg = ExecdConfig(
        socket_fd=5,
        admin_socket_fd=6,
        control_socket="/run/c.sock",
        sandbox_id="s1",
        execution_id="e1",
        socket_mode="640",
        workload=["python3", "-m", "http.server"],
        workload_cwd="/srv",
        exit_with_workload=False,
        probe=ProbeConfig(tcp_port=8000, interval_seconds=1.5, timeout_seconds=0.5),
        grace_seconds=2.0,
        ring_bytes=2048,
        coalesce_seconds=0.1,
        body_idle_timeout_seconds=11.0,
        write_timeout_seconds=12.0,
        unset_env=["A"],
        logging={"level": "debug", "format": "json"},
    )
    opts = to_options(cfg)
    assert parse_argv(to_argv(opts)) == opts
    assert opts == ExecdOptions(
        socket_fd=5,
        admin_socket_fd=6,
        control_socket="/run/c.sock",
        sandbox_id="s1",
        execution_id="e1",
        socket_mode=0o640,
        workload=("python3", "-m", "http.server"),
        workload_cwd="/srv",
        exit_with_workload=False,
        probe_tcp_port=8000,
        probe_interval=1.5,
        probe_timeout=0.5,
        grace_seconds=2.0,
        ring_bytes=2048,
        coalesce_seconds=0.1,
        unset_env=("A",),
        body_idle_timeout=11.0,
        write_timeout=12.0,
        log_level="debug",
        log_format="json",
    )


def test_sandboxd_starts_execd_with_its_options() -> None:
    api = SandboxdExecdOptions(
        python="/usr/bin/python3",
        execution_id="x-1",
        probe=ProbeOptions(command="test -e /ready", interval_seconds=0.5),
        grace_seconds=1.0,
    )
    argv = api.init_argv("sbx-1", ["sleep", "100"], "app")
    assert argv[:3] == ["/usr/bin/python3", "-m", "adx.execd"]
    opts = parse_argv(argv[3:])
    assert (opts.socket, opts.socket_fd, opts.admin_socket_fd) == (None, 3, 4)
    assert opts.control_socket == "/run/adx-control/control.sock"
    assert (opts.sandbox_id, opts.execution_id, opts.user) == ("sbx-1", "x-1", "app")
    assert (opts.probe_command, opts.probe_interval, opts.probe_timeout) == ("test -e /ready", 0.5, 2.0)
    assert opts.grace_seconds == 1.0 and opts.exit_with_workload and opts.workload == ("sleep", "100")
    assert opts.unset_env == ("PYTHONPATH",)
    assert not parse_argv(api.init_argv("sbx-2", [], None)[3:]).exit_with_workload, "no workload: keep serving"


def test_the_http_timeouts_default_to_the_servers_own() -> None:
    from adx.execd import _http

    defaults = ExecdOptions()
    assert (defaults.body_idle_timeout, defaults.write_timeout) == (_http.BODY_IDLE_TIMEOUT, _http.WRITE_TIMEOUT)

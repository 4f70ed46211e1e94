"""The console script: help that explains, one-line errors for bad input."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from eagleeye.cli import _joined_values, build_parser
from eagleeye.commands import COMMANDS


def eagleeye(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagleeye", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def subcommands() -> list[str]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(action.choices)


def test_every_subcommand_is_listed_and_explains_itself() -> None:
    top = eagleeye("--help")
    assert top.returncode == 0
    names = subcommands()
    assert len(names) == len(COMMANDS)
    for name in names:
        assert name in top.stdout
        result = eagleeye(name, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: eagleeye {name}")
        assert len(result.stdout.splitlines()) > 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--nproc-per-node", "0", "x.py"], "must be at least 1"),
        (["run", "--bogus", "x.py"], "unrecognized arguments: --bogus"),
        (["run", "missing_script.py"], "script 'missing_script.py' not found"),
        (["run", "-m", "no_such_module_xyz"], "module 'no_such_module_xyz' not found"),
        (["run", "--inject", "explode:rank=0@step=1", "x.py"], "unknown fault kind 'explode'"),
        (["run", "--nproc-per-node", "3", "--replicas", "2", "x.py"], "cannot be split"),
        (["run", "--min-replicas", "0", "x.py"], "--min-replicas: must be at least 1, got 0"),
        (
            ["run", "--nnodes", "2", "--replicas", "2", "--min-replicas", "3", "x.py"],
            "--min-replicas 3 is not between 1 and the job's 2 replicas",
        ),
        (["detect", "x.py", "--live", "--config", "c.toml"], "--live and --config"),
        (["eval", "export", ".", "out.txt"], "OUT must end in .csv or .parquet"),
        (["eval", "export", "nowhere", "out.csv"], "no run store at nowhere"),
        (["run", "--nproc-per-node", "two", "x.py"], "expected a whole number, got 'two'"),
        (["run", "--metrics-port", "99999", "x.py"], "a port is 0 to 65535"),
        (["run", "--grace-period", "-1", "x.py"], "must be a finite number of seconds"),
        (["run", "--stream", "two", "x.py"], "'two' is not all, none or a comma list"),
        (["run", "--recovery", "replica", "x.py"], "--recovery replica needs a script"),
        (["run", "--inject", "nan:rank=0@time=3", "x.py"], "cannot fire at a time"),
        (
            ["run", "--max-restarts", "1", "--inject", "kill:rank=0@step=2,attempt=2", "x.py"],
            "it could never fire",
        ),
        (["run", "--policy", "missing.toml", "x.py"], "missing.toml"),
        (["plan", "--gpus", "8", "--plot", "/nonexistent/dir/x.png"], "does not exist"),
        (["plan", "--gpus", "8", "--html", "/nonexistent/dir/x.html"], "does not exist"),
        (["detect", "x.py", "-o", "/nonexistent/out.jsonl"], "folder /nonexistent does not"),
        (["eval", "export", ".", "/nonexistent/x.csv"], "folder /nonexistent does not exist"),
        (["demo", "--steps", "0"], "--steps 0 is too short for the demo"),
        (["demo", "--kill-step", "500"], "--kill-step 500 is not between 1 and the last step"),
    ],
)
def test_bad_input_is_one_clear_line_and_no_traceback(tmp_path, args, message) -> None:
    (tmp_path / "x.py").write_text("print('never run')\n")
    result = eagleeye(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("eagleeye")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_busy_metrics_port_is_one_line_and_leaves_no_run_folder(tmp_path) -> None:
    (tmp_path / "x.py").write_text("print('never run')\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = eagleeye("run", "--metrics-port", str(port), "x.py", cwd=tmp_path)
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_resume_args_take_the_scripts_own_flags_as_their_value() -> None:
    args = build_parser().parse_args(
        _joined_values(["run", "--resume-args", "--init_from=resume", "t.py", "--resume-args"])
    )
    assert args.resume_args == "--init_from=resume"
    assert args.script_args == ["--resume-args"]


def test_an_unwritable_runs_dir_is_a_clear_error(tmp_path) -> None:
    (tmp_path / "x.py").write_text("print('never run')\n")
    (tmp_path / "blocker").write_text("a file, not a folder")
    result = eagleeye("run", "--runs-dir", "blocker/runs", "x.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot create run folder" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_resume_refuses_what_it_cannot_resume(tmp_path) -> None:
    (tmp_path / "x.py").write_text("print('done')\n")
    assert eagleeye("run", "--run-id", "r1", "x.py", cwd=tmp_path).returncode == 0
    for args, message in [
        (["run", "--resume", "runs/r1"], "the run succeeded; there is nothing to resume"),
        (["run", "--resume", "nowhere"], "--resume nowhere: no run store (run.db) there"),
        (["run", "--resume", "runs/r1", "x.py"], "--resume takes the script from the run's"),
        (["run"], "give the SCRIPT to run (or --resume RUN_DIR)"),
    ]:
        result = eagleeye(*args, cwd=tmp_path)
        assert result.returncode == 2, args
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr

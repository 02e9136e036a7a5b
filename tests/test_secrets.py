"""No secret in any output: a store URL's password never reaches an error, a log line, a stored run, a report or an
export. Every command that takes ``--store`` is run with a password-bearing URL, once against a server that is not
there (the error path) and once against a real PostgreSQL database (the path that stores, reads and writes files);
what each printed, what the store holds and every file written are searched for the password."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.contract.secrets import MASK, hide_passwords, hide_passwords_in
from harness.store import db, retry, schema
from tests.helpers import TINY_SUITE, invoke

pytest_plugins = ["tests.postgres"]     # fixtures: postgres, postgres_url

SECRET = "S3cretPW"
NOWHERE = f"postgresql://alice:{SECRET}@127.0.0.1:9/benchdb"     # port 9 (discard): nothing listens


def _suite(tmp: Path) -> Path:
    suite = tmp / "tiny.toml"
    suite.write_text(textwrap.dedent(TINY_SUITE).replace("[16, 32, 64]", "[16, 32]"))
    return suite


def test_hide_passwords_masks_the_password_and_keeps_the_rest() -> None:
    assert hide_passwords(NOWHERE) == f"postgresql://alice:{MASK}@127.0.0.1:9/benchdb"
    assert hide_passwords(f"cannot open 'postgresql+psycopg://u:{SECRET}@h/db': refused") == \
        f"cannot open 'postgresql+psycopg://u:{MASK}@h/db': refused"
    assert hide_passwords(f"postgresql://u:a@b/c{SECRET}@h/db") == f"postgresql://u:{MASK}@h/db"   # '@' and '/' in it
    assert hide_passwords(f"host=h password={SECRET} dbname=x") == f"host=h password={MASK} dbname=x"
    assert hide_passwords(f"postgresql://u@h/db?sslmode=require&password={SECRET}").endswith(f"password={MASK}")
    for plain in ("sqlite:///results/bench.sqlite", "postgresql://u@h/db", "see https://example.org/a:b@c"):
        assert hide_passwords(plain) == plain
    assert hide_passwords_in({"argv": ["--store", NOWHERE], "n": 3}) == {"argv": ["--store", hide_passwords(NOWHERE)],
                                                                       "n": 3}


COMMANDS = (["runs"], ["show", "latest"], ["export", "latest", "--format", "json"], ["compare", "a", "b"],
            ["merge", "other.sqlite"], ["report", "latest", "-o", "r.html"], ["run", "SUITE", "--quick"],
            ["baseline", "SUITE", "--quick", "-o", "b.json"], ["check", "SUITE", "--quick", "--baseline", "b.json"],
            ["run", "SUITE", "--debug"], ["--debug", "runs"])


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_a_store_that_cannot_be_reached_is_named_without_its_password(command, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(retry, "RETRY_FOR_S", 0.1)        # a refused connection is retried (a restarting server)
    (tmp_path / "b.json").write_text("{}")
    suite = str(_suite(tmp_path))
    result = invoke(*[suite if word == "SUITE" else word for word in command], "--store", NOWHERE)
    said = result.output + result.stderr
    assert result.exit_code == 2, said
    assert SECRET not in said
    last = result.stderr.strip().splitlines()[-1]       # (bench baseline says what it will measure first)
    assert last.startswith("bench: error: --store:") and f"alice:{MASK}@127.0.0.1:9" in last


def test_claims_list_with_an_unreachable_store_says_no_password(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("claims", "--list", "--only", "C01", "--store", NOWHERE)
    assert result.exit_code == 0 and SECRET not in result.output + result.stderr


def _stored_text(url: str) -> str:
    """Every row of every table of the store at ``url``, as text."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [str(r) for t in sa.inspect(conn).get_table_names()
                for r in conn.execute(sa.text(f'SELECT * FROM "{t}"'))]
    engine.dispose()
    assert rows
    return "\n".join(rows)


def test_every_command_on_a_password_store_keeps_the_password_out(postgres_url, tmp_path, monkeypatch) -> None:
    """A real store reached with a password (the test server trusts, so any password connects): a run, then every
    command that reads it; the printed text, the stored rows and every written file hold no password."""
    monkeypatch.chdir(tmp_path)
    url = postgres_url.replace("://bench@", f"://bench:{SECRET}@")
    assert SECRET in url
    suite = str(_suite(tmp_path))
    said = []

    def bench(*args: str, code: int = 0) -> None:
        result = invoke(*args, "--store", url)
        said.append(result.output + result.stderr)
        assert result.exit_code == code, said[-1]

    bench("run", suite, "--quick", "--executor", "inline", "--no-calibrate", "--report", "run.html")
    bench("run", suite, "--quick", "--executor", "inline", "--no-calibrate", "--no-report")
    bench("runs")
    bench("show", "latest")
    for fmt, out in (("json", "e.json"), ("csv", "e.csv"), ("tidy-csv", "e.tidy.csv"),
                     ("pytest-benchmark", "e.pb.json"), ("parquet", "e.parquet")):
        bench("export", "latest", "--format", fmt, "-o", out)
    bench("export", "latest", "--format", "json")
    bench("compare", "latest", "latest")
    bench("report", "latest", "-o", "report.html")
    local = tmp_path / "local.sqlite"
    assert invoke("run", suite, "--quick", "--executor", "inline", "--no-calibrate", "--no-report",
                  "--store", f"sqlite:///{local}").exit_code == 0
    bench("merge", str(local))
    assert "made by: bench run" in said[3] and f"bench:{MASK}@" in said[3]     # bench show: the run's options
    printed = "\n".join(said)
    assert SECRET not in printed
    assert SECRET not in _stored_text(postgres_url)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".html", ".json", ".csv", ".parquet")]
    assert len(written) >= 7
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path


def test_a_log_line_that_names_a_password_url_is_shown_without_it(capsys) -> None:
    import logging

    from cli.common import show_logs
    show_logs()
    logging.getLogger("bench").warning("store %s went away", NOWHERE)
    said = capsys.readouterr().err
    assert SECRET not in said and f"alice:{MASK}@" in said


def test_an_older_store_that_kept_a_password_in_a_runs_argv_is_cleaned_when_upgraded(tmp_path) -> None:
    """A run stored by an older bench kept its argv (``--store URL``) with the password: read, it is shown hidden;
    opened for writing, the upgrade to the schema that stores invocations rewrites the row without it."""
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    store = db.Store(url)
    run = store.create_run("s", "s.toml", True, 0, {}, {})
    with store.engine.begin() as conn:          # as an older bench wrote it: the raw argv, schema 5
        conn.execute(schema.runs.update().values(options={"argv": ["runs", "--store", NOWHERE]}))
        conn.execute(sa.text("ALTER TABLE runs DROP COLUMN invocation"))
        conn.execute(sa.text("UPDATE bench_meta SET value = '5' WHERE key = 'schema_version'"))
    old = db.Store(url, create=False)
    assert old.version == 5 and old.get_run(run).options["argv"][-1] == hide_passwords(NOWHERE)
    db.Store(url)                               # opened for writing: upgraded in place
    assert SECRET not in _stored_text(url)

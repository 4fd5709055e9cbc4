"""``etl-craft-airflow check`` reports every problem at once, as etl-craft's ``doctor``: one line per check, a
summary line, exit 1 on any failure (0 with warnings), the same facts as JSON, and never a secret."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from airflow_provider_etl_craft.auth import AUTH_MODES
from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine import doctor
from harness.engines import EngineSetup, write_config

LINE = re.compile(r"^\[(OK  |WARN|FAIL)\] ([^:]+): (.+)$")
SUMMARY = re.compile(r"^(\d+) ok, (\d+) warning\(s\), (\d+) failed$")
#: A port nothing listens on: connecting is refused at once.
CLOSED = "jdbc:postgresql://127.0.0.1:9/etl"


def check(config: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["check", "--config", str(config), *args], out, err)
    return status, out.getvalue(), err.getvalue()


def parsed(text: str) -> tuple[list[tuple[str, str, str]], tuple[int, int, int]]:
    """The check lines as (status, name, message) and the summary's counts; every line is one or the other."""
    *lines, last = text.splitlines()
    rows = []
    for line in lines:
        match = LINE.match(line)
        assert match, f"not a check line: {line!r}"
        rows.append((match.group(1).strip(), match.group(2), match.group(3)))
    summary = SUMMARY.match(last)
    assert summary, f"not the summary line: {last!r}"
    counts = (int(summary.group(1)), int(summary.group(2)), int(summary.group(3)))
    assert counts == tuple(sum(1 for r in rows if r[0] == s) for s in ("OK", "WARN", "FAIL"))
    return rows, counts


@pytest.fixture(autouse=True)
def _local_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's executor decides the SQLite Engine DB kind check; LocalExecutor unless a test says otherwise."""
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")


# -- a healthy setup, JSON, secrets ---------------------------------------------------------------------------


def test_a_healthy_setup_is_all_ok_and_exits_0(engine: EngineSetup) -> None:
    engine.hook().init_db()
    status, out, err = check(engine.config_path)
    rows, (oks, warnings, failed) = parsed(out)
    assert (status, err, warnings, failed) == (0, "", 0, 0), out
    names = [name for _, name, _ in rows]
    assert names == [
        "Configuration", "Secrets source", "Engine profile", "Engine.test.jdbc_url", "Engine.test.schema",
        *(["Engine.test.auth_mode", "Engine.test.user"] if engine.dialect == "postgresql" else
          ["Engine.test.auth_mode"]),
        "Engine DB secret", "Engine DB auth", "Engine DB kind", "Engine DB connection", "Engine DB schema",
        "Engine DB tables", "Engine DB migrations",
    ]  # fmt: skip
    assert oks == len(rows)
    if engine.dialect == "postgresql":
        assert (
            "[OK  ] Engine DB secret: Engine.test.secret resolved from ENGINE_SECRET (value not shown)\n"
            in out
        )
        assert "[OK  ] Engine DB auth: auth_mode password, verified against a live PostgreSQL server\n" in out
    assert "[OK  ] Engine DB migrations: none pending" in out


def test_json_holds_the_same_checks_and_summary_as_the_text(engine: EngineSetup, tmp_path: Path) -> None:
    engine.hook().init_db()
    folder = tmp_path / "migs"
    folder.mkdir()
    (folder / "0001_a.sql").write_text("CREATE TABLE A1 (X INTEGER);\n", encoding="utf-8")
    text_status, text, _ = check(engine.config_path, "--migrations-dir", str(folder))
    json_status, document, err = check(
        engine.config_path, "--migrations-dir", str(folder), "--format", "json"
    )
    rows, (oks, warnings, failed) = parsed(text)
    doc = json.loads(document)  # one document and nothing else on stdout
    assert (text_status, json_status, err) == (1, 1, "")
    assert [(c["status"], c["name"], c["message"]) for c in doc["checks"]] == rows
    assert doc["summary"] == {"ok": oks, "warning": warnings, "failed": failed} and failed == 1
    assert doc["checks"][-1] == {
        "name": "Engine DB migrations",
        "status": "FAIL",
        "message": "1 pending: PROJECT 0001_a.sql; apply with `etl-craft-airflow migrate` or "
        "EngineInitDbOperator(apply_migrations=True)",
    }


@pytest.mark.postgres
def test_no_secret_is_printed_in_text_or_json(make_engine, tmp_path: Path) -> None:
    setup = make_engine("postgresql")
    setup.hook().init_db()
    secret = setup.env["ENGINE_SECRET"]
    printed = "".join(check(setup.config_path)[1:]) + "".join(
        check(setup.config_path, "--format", "json")[1:]
    )
    assert "ENGINE_SECRET" in printed and secret not in printed
    # a wrong password: the refused login is reported, the password is not
    setup.config_path.write_text(setup.config_path.read_text().replace("ENGINE_SECRET", "WRONG_SECRET"))
    wrong = "not-the-password-Qx81"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WRONG_SECRET", wrong)
        status, out, err = check(setup.config_path, "--verbose")
    assert status == 1 and "[FAIL] Engine DB connection: " in out and wrong not in out + err


# -- several problems, warnings, not-checked ----------------------------------------------------------------


def test_several_problems_are_all_reported_with_the_summary(tmp_path: Path, monkeypatch) -> None:
    for name in ("ENGINE_USER", "ENGINE_DEV_USER", "ENGINE_SECRET", "ENGINE_DEV_SECRET"):
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path, (
        f"Engine:\n  dev:\n    jdbc_url: {CLOSED}\n    schema: 9lives\n    user: ENGINE_USER\n"
        "    auth_mode: password\n    secret: ENGINE_SECRET\n    region: eu-west-1\n"
    ))  # fmt: skip
    status, out, err = check(config)
    rows, counts = parsed(out)
    assert status == 1 and err == ""
    by_name = {name: (state, message) for state, name, message in rows}
    assert (
        by_name["Engine.dev.schema"][0] == "FAIL"
        and "must be a plain identifier" in by_name["Engine.dev.schema"][1]
    )
    assert by_name["Engine.dev.auth_mode"] == (  # ignored, as etl-craft ignores it: a warning, not a failure
        "WARN",
        "'password', as written; Engine.dev.region is not used by auth_mode 'password' (it takes user, secret) "
        "and ignored, as etl-craft ignores it; remove it, or set the auth_mode that takes it",
    )
    assert (
        by_name["Engine.dev.user"][0] == "WARN" and "no variable ENGINE_USER" in by_name["Engine.dev.user"][1]
    )
    assert (
        by_name["Engine DB secret"][0] == "FAIL"
        and "names variable ENGINE_SECRET" in by_name["Engine DB secret"][1]
    )
    for name in doctor.ENGINE_DB_CHECKS:  # listed, not dropped
        assert by_name[name] == ("FAIL", "not checked: needs every setting of the profile, and one failed")
    assert counts == (6, 2, 6), out


def test_a_missing_file_fails_every_check_as_not_checked(tmp_path: Path) -> None:
    status, out, _ = check(tmp_path / "nowhere.yml")
    rows, counts = parsed(out)
    assert status == 1 and rows[0][:2] == ("FAIL", "Configuration") and "does not exist" in rows[0][2]
    assert [name for _, name, _ in rows[1:]] == ["Secrets source", "Engine profile", *doctor.PROFILE_CHECKS]
    assert {message for _, _, message in rows[1:]} == {"not checked: needs Configuration, which failed"}
    assert counts == (0, 0, len(rows))


@pytest.mark.parametrize(
    ("value", "twin"),
    [("ETL_CRAFT_USER", " (nor its profile twin ETL_CRAFT_DEV_USER)"), ("ETL_USER_2", "")],
)  # the twin goes before the field's suffix: a name not ending in _USER has none
def test_a_value_that_reads_like_an_unset_variable_warns(
    value: str, twin: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv(value, raising=False)
    monkeypatch.setenv("ENGINE_SECRET", "s3cret-Zp0")
    config = write_config(tmp_path, (
        f"Engine:\n  dev:\n    jdbc_url: {CLOSED}\n    schema: etl\n    user: {value}\n"
        "    auth_mode: password\n    secret: ENGINE_SECRET\n"
    ))  # fmt: skip
    status, out, _ = check(config)
    (line,) = [line for line in out.splitlines() if line.startswith("[WARN]")]
    assert line.startswith(
        f"[WARN] Engine.dev.user: '{value}', as written, but it reads like a variable name: "
    )
    assert f"no variable {value}{twin} is set in the environment secrets source" in line
    monkeypatch.setenv(value, "etl_user")  # set: its value is used, and not shown
    status, out, _ = check(config)
    assert f"[OK  ] Engine.dev.user: from variable {value} (value not shown)\n" in out
    assert "[WARN]" not in out
    if twin:  # the profile twin, when defined, wins: the line names the variable actually used
        monkeypatch.setenv("ETL_CRAFT_DEV_USER", "etl_dev_user")
        status, out, _ = check(config)
        assert "[OK  ] Engine.dev.user: from variable ETL_CRAFT_DEV_USER (value not shown)\n" in out


def test_ordinary_values_used_as_written_do_not_warn(tmp_path: Path) -> None:
    """Lower-case names (``etl``, ``password``, ``etl_user``) are values, not forgotten variables."""
    config = write_config(tmp_path, "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:e.db\n    schema: main\n")
    assert main(["init-db", "--config", str(config)], io.StringIO(), io.StringIO()) == 0
    status, out, _ = check(config)
    assert status == 0 and "[WARN]" not in out and "[OK  ] Engine.dev.schema: 'main', as written\n" in out


def test_warnings_alone_exit_0(engine: EngineSetup) -> None:
    """A key the auth mode does not use is ignored, as etl-craft ignores it: a warning, and exit 0."""
    engine.hook().init_db()
    engine.config_path.write_text(engine.config_path.read_text() + "    region: eu-west-1\n")
    status, out, _ = check(engine.config_path)
    _, (_, warnings, failed) = parsed(out)
    assert (status, warnings, failed) == (0, 1, 0), out
    (line,) = [line for line in out.splitlines() if line.startswith("[WARN]")]
    assert line.startswith("[WARN] Engine.test.auth_mode: ") and "Engine.test.region is not used by " in line
    assert "ignored, as etl-craft ignores it" in line


def test_a_profile_selector_naming_an_unset_variable_fails_naming_it(
    engine: EngineSetup, monkeypatch
) -> None:
    """As etl-craft: an unset variable's name is used as written, so it selects a profile of that name."""
    monkeypatch.delenv("ETL_ACTIVE_PROFILE", raising=False)
    monkeypatch.delenv("ETL_OTHER_PROFILE", raising=False)
    engine.hook().init_db()
    body = engine.config_path.read_text()[len("Engine:\n") :]
    engine.config_path.write_text("Engine:\n  Profile: ETL_ACTIVE_PROFILE\n" + body)
    status, out, _ = check(engine.config_path)
    assert status == 1 and (
        "[FAIL] Engine profile: " in out
        and "Engine.Profile selects profile 'ETL_ACTIVE_PROFILE' (no variable ETL_ACTIVE_PROFILE is set, so the "
        "text itself was used), which does not exist; profiles: test\n"
        in out
    ), out
    monkeypatch.setenv("ETL_ACTIVE_PROFILE", "test")
    status, out, _ = check(engine.config_path)
    assert status == 0 and "[OK  ] Engine profile: 'test', chosen by Engine.Profile (from variable " in out
    # Secrets.Profile is read too, though Engine.Profile decides: naming an unset variable, it warns
    engine.config_path.write_text(
        "Secrets:\n  Profile: ETL_OTHER_PROFILE\nEngine:\n  Profile: ETL_ACTIVE_PROFILE\n" + body
    )
    status, out, _ = check(engine.config_path)
    _, (_, warnings, failed) = parsed(out)
    assert (status, warnings, failed) == (0, 1, 0), out
    assert (
        "[WARN] Engine profile: 'test', chosen by Engine.Profile (from variable ETL_ACTIVE_PROFILE); "
        "Secrets.Profile names variable ETL_OTHER_PROFILE, which is not set in the environment secrets source: "
        "where it decides, it selects a profile 'ETL_OTHER_PROFILE', which does not exist" in out
    ), out


def test_unknown_keys_and_a_wrong_name_fail_and_the_other_settings_are_still_checked(tmp_path: Path) -> None:
    """Only the active profile's keys are checked, after it is chosen; Name must match the jdbc_url."""
    config = write_config(tmp_path, (
        "Engine:\n  Name: PostgreSQL\n  dev:\n    jdbc_url: jdbc:sqlite:e.db\n    schema: 9lives\n"
        "    colour: blue\n  other:\n    shape: round\n"
    ))  # fmt: skip
    status, out, err = check(config, "--profile", "dev")
    rows, _ = parsed(out)
    by_name = {name: (state, message) for state, name, message in rows}
    assert status == 1 and err == ""
    state, message = by_name["Engine profile"]
    assert state == "FAIL" and "unknown key(s) in Engine.dev: colour" in message and "shape" not in out
    state, message = by_name["Engine.Name"]
    assert state == "FAIL" and "but the jdbc_url is a SQLite URL" in message
    assert by_name["Engine.dev.schema"][0] == "FAIL"
    assert by_name["Engine DB connection"] == ("FAIL", "not checked: needs Engine profile, which failed")
    config.write_text("Engine:\n  Name: sqlite\n  dev:\n    jdbc_url: jdbc:sqlite:e.db\n")
    assert main(["init-db", "--config", str(config)], io.StringIO(), io.StringIO()) == 0
    status, out, _ = check(config)
    assert status == 0 and "[OK  ] Engine.Name: 'sqlite', as written\n" in out, out


def test_a_sqlite_engine_db_under_a_remote_executor_warns(engine: EngineSetup, monkeypatch) -> None:
    engine.hook().init_db()
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    status, out, _ = check(engine.config_path)
    (kind,) = [line for line in out.splitlines() if "Engine DB kind" in line]
    if engine.dialect == "sqlite":
        assert status == 0 and kind.startswith("[WARN] Engine DB kind: SQLite suits one machine, but ")
        assert "CeleryExecutor" in kind
    else:
        assert status == 0 and kind.startswith("[OK  ] Engine DB kind: PostgreSQL")


# -- auth modes ------------------------------------------------------------------------------------------------


def test_every_auth_mode_is_either_verified_or_warned_about_with_a_reason() -> None:
    assert doctor.VERIFIED_AUTH_MODES | set(doctor.UNVERIFIED_AUTH_MODES) == {"none", *AUTH_MODES}
    assert not doctor.VERIFIED_AUTH_MODES & set(doctor.UNVERIFIED_AUTH_MODES)


UNVERIFIED = {
    "token": "    user: etl\n    secret: ENGINE_SECRET\n",
    "oauth": "    user: etl\n    client_id: c\n    token_url: https://login.example.com/t\n    secret: ENGINE_SECRET\n",
    "sso": "    user: etl\n    issuer: https://login.example.com\n    client_id: c\n",
    "sts": "    user: etl\n    region: eu-west-1\n",
}


@pytest.mark.parametrize("mode", sorted(UNVERIFIED))
def test_an_unverified_auth_mode_warns_and_the_other_problems_still_show(
    mode: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", "s3cret-Zp0")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "not-a-real-key"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):  # sts signs its token here, without AWS
        monkeypatch.setenv(name, value)
    config = write_config(tmp_path, (
        f"Engine:\n  dev:\n    jdbc_url: {CLOSED}\n    schema: etl\n    auth_mode: {mode}\n{UNVERIFIED[mode]}"
    ))  # fmt: skip
    status, out, _ = check(config)
    rows, _ = parsed(out)
    (auth,) = [r for r in rows if r[1] == "Engine DB auth"]
    assert auth[0] == "WARN" and auth[2].startswith(f"auth_mode {mode} follows the vendor's documentation")
    assert doctor.UNVERIFIED_AUTH_MODES[mode] in auth[2] and "success is not guaranteed" in auth[2]
    assert status == 1 and [r[0] for r in rows if r[1] == "Engine DB connection"] == [
        "FAIL"
    ]  # nothing listens
    assert "s3cret-Zp0" not in out

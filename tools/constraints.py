"""Make and check the pinned dependency sets: managed images, test lines, Python 3.12 resolutions.

Three kinds of file live under ``constraints/``:

* ``images/airflow-<version>-py<python>.txt``: what a managed image of that Airflow release holds. Managed
  services (MWAA, Cloud Composer) build images from Airflow's own constraints for the release, which pin
  every provider at its newest release on the day Airflow was released. ``image`` rebuilds that set with
  ``uv pip compile --exclude-newer <release day>`` (the index's upload times), so it needs no access to
  Airflow's GitHub constraints branches.
* ``constraints-airflow-<line>-py<python>.txt``: what ``make test AIRFLOW=<line>`` installs. The newest
  line takes the newest releases; older lines install on top of their managed image, so the smoke set
  runs against the provider versions those images ship, OpenLineage's included (``OPENLINEAGE``: the
  [openlineage] extra at the image's releases, which the older lines' smoke venvs install). Python 3.11
  sets are made Airflow's way (fresh venv, install, ``pip freeze``); Python 3.12 sets by pip's cross-target
  resolution, since no 3.12 interpreter is on the CI machine.
* ``check`` (run by ``.ci/run``) proves two things with pip: each Python 3.12 line set still resolves
  against this project, and the provider installs into each managed image without changing any package
  the image pins (pip resolves under the image's constraints, as MWAA's ``--constraint`` install does).

Usage: ``python tools/constraints.py image 3.0.6`` · ``line 3.0`` (``--keep``: add a new dependency, keep
every other pin) · ``check``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints"
IMAGES = CONSTRAINTS / "images"
PYTHONS = ("3.11", "3.12")

#: Airflow line -> (release tested, managed image it installs on; None = newest releases).
LINES: dict[str, tuple[str, str | None]] = {
    "3.0": ("3.0.6", "3.0.6"),
    "3.1": ("3.1.7", "3.1.7"),
    "3.2": ("3.2.1", "3.2.1"),
    "3.3": ("3.3.2", None),
}
#: Airflow line -> the OpenLineage provider and client (openlineage-python, -integration-common, -sql) of its
#: managed image, which Airflow's constraints for the release pin; the [openlineage] extra installs them in the
#: line's venv (docs/lineage.md). None: the newest releases.
OPENLINEAGE: dict[str, tuple[str, str] | None] = {
    "3.0": ("2.6.1", "1.37.0"),
    "3.1": ("2.10.1", "1.43.0"),
    "3.2": ("2.14.0", "1.46.0"),
    "3.3": None,
}
#: What a line's venv installs of this package: the [dev] extra, and the [openlineage] one at the image's pins.
EXTRAS = ("dev", "openlineage")
#: Managed images the install check covers (MWAA 3.0.6 / 3.2.1 / 3.3.1, Composer 3.1.7 / 3.3.1).
IMAGE_RELEASES = ("3.0.6", "3.1.7", "3.2.1", "3.3.1")
#: What an image carries besides Airflow: the providers this package uses or tests with.
IMAGE_PROVIDERS = (
    "apache-airflow-providers-common-compat",
    "apache-airflow-providers-common-sql",
    "apache-airflow-providers-postgres",
    "apache-airflow-providers-standard",
    "apache-airflow-providers-sqlite",
)
INDEX = "https://pypi.org/simple"


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kw)  # type: ignore[call-overload]


def release_day(version: str) -> str:
    """The upload time of ``apache-airflow==version``'s wheel, from the index's JSON simple API."""
    request = urllib.request.Request(
        f"{INDEX}/apache-airflow/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == f"apache_airflow-{version}-py3-none-any.whl":
            uploaded = dt.datetime.fromisoformat(entry["upload-time"].replace("Z", "+00:00"))
            return (uploaded + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    raise SystemExit(f"apache-airflow {version} has no wheel on {INDEX}")


def image_path(version: str, python: str) -> Path:
    return IMAGES / f"airflow-{version}-py{python}.txt"


def line_path(line: str, python: str) -> Path:
    return CONSTRAINTS / f"constraints-airflow-{line}-py{python}.txt"


def _pins(text: str) -> list[str]:
    return sorted(
        (ln.strip() for ln in text.splitlines() if "==" in ln and not ln.lstrip().startswith("#")),
        key=str.lower,
    )


def pin_map(text: str) -> dict[str, str]:
    """Canonical project name -> pinned version (pip freeze and uv spell names differently)."""
    from packaging.utils import canonicalize_name

    return {canonicalize_name(name): version for name, version in (p.split("==") for p in _pins(text))}


def make_image(version: str) -> None:
    uv = shutil.which("uv") or sys.exit("image needs uv on PATH (pip install uv)")
    cutoff = release_day(version)
    with tempfile.TemporaryDirectory() as tmp:
        wanted = Path(tmp, "image.in")
        wanted.write_text("\n".join([f"apache-airflow=={version}", *IMAGE_PROVIDERS]) + "\n")
        for python in PYTHONS:
            out = Path(tmp, f"py{python}.txt")
            _run(
                uv,
                "pip",
                "compile",
                "--no-config",
                "--quiet",
                "--no-header",
                "--no-annotate",
                "--index-url",
                INDEX,
                "--python-version",
                python,
                "--exclude-newer",
                cutoff,
                "--resolution",
                "highest",
                wanted,
                "-o",
                out,
            )
            header = (
                f"# Managed image stand-in: apache-airflow {version} with the providers released by {cutoff}\n"
                f"# (what Airflow's own constraints-{version} pin), Python {python}.\n"
                f"# Made by: python tools/constraints.py image {version}\n"
            )
            IMAGES.mkdir(parents=True, exist_ok=True)
            image_path(version, python).write_text(header + "\n".join(_pins(out.read_text())) + "\n")


def make_line(line: str, keep: bool = False) -> None:
    """Rebuild a line's sets; with ``keep``, every pin of the current sets stays and only what is new resolves."""
    release, image = LINES[line]
    requirements = [f"apache-airflow=={release}", *IMAGE_PROVIDERS, *_openlineage_pins(line)]
    made = dt.date.today().isoformat()
    source = f"on the managed image set images/airflow-{image}" if image else "with the newest releases"
    with tempfile.TemporaryDirectory() as tmp:
        for python in PYTHONS:
            image_args = ["-c", str(image_path(image, python))] if image else []
            current = line_path(line, python)
            if keep and current.exists():
                kept = Path(tmp, f"kept-{python}.txt")
                kept.write_text("\n".join(_pins(current.read_text())) + "\n")
                image_args += ["-c", str(kept)]
            if python == f"{sys.version_info[0]}.{sys.version_info[1]}":
                venv = Path(tmp, "venv")
                _run(sys.executable, "-m", "venv", venv)
                pip = venv / "bin" / "pip"
                # As the Makefile's venvs do: the pip a new venv bundles can backtrack for ever.
                _run(pip, "install", "-q", "--upgrade", "pip>=24")
                _run(pip, "install", "-q", *image_args, *requirements, f"{ROOT}[{','.join(EXTRAS)}]")
                frozen = _run(pip, "freeze", "--exclude-editable", capture_output=True).stdout
                pins = [p for p in _pins(frozen) if not p.startswith("airflow-provider-etl-craft==")]
                how = "installed in a fresh venv, then pip freeze"
            else:
                report = Path(tmp, "report.json")
                _run(
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--dry-run",
                    "--ignore-installed",
                    "--report",
                    report,
                    "--python-version",
                    python,
                    "--only-binary=:all:",
                    "--target",
                    Path(tmp, "target"),
                    *image_args,
                    *requirements,
                    *_project_requirements(*EXTRAS),
                )
                installs = json.loads(report.read_text())["install"]
                pins = sorted(
                    (f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs), key=str.lower
                )
                how = "resolved with pip --dry-run --python-version (not installed)"
            header = (
                f"# make test AIRFLOW={line}: apache-airflow {release} {source}, this package and its [dev]\n"
                f"# and [openlineage] extras, Python {python}: {how} ({made}).\n"
                f"# Made by: python tools/constraints.py line {line}\n"
            )
            line_path(line, python).write_text(header + "\n".join(pins) + "\n")


def _project_requirements(*extras: str) -> list[str]:
    """The project's declared requirements (plus those of ``extras``), read from pyproject.toml."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [
        *project["dependencies"],
        *(r for extra in extras for r in project["optional-dependencies"][extra]),
    ]


def _openlineage_pins(line: str) -> list[str]:
    """The line's managed-image OpenLineage releases as requirements (none for the newest line)."""
    pinned = OPENLINEAGE[line]
    if pinned is None:
        return []
    provider, client = pinned
    clients = ("openlineage-python", "openlineage-integration-common", "openlineage-sql")
    return [f"apache-airflow-providers-openlineage=={provider}", *(f"{name}=={client}" for name in clients)]


def _wheel(tmp: Path) -> Path:
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, ROOT)
    return next(tmp.glob("airflow_provider_etl_craft-*.whl"))


def _resolve(target: Path, python: str, constraint: Path, *requirements: str | Path) -> dict[str, str]:
    """pip's resolution of ``requirements`` for ``python`` under ``constraint``: name -> version."""
    report = target / "report.json"
    cross = ["--python-version", python, "--only-binary=:all:", "--target", target / "t"]
    _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--dry-run",
        "--ignore-installed",
        "--report",
        report,
        *cross,
        "-c",
        constraint,
        *requirements,
    )
    from packaging.utils import canonicalize_name

    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def check() -> int:
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _wheel(Path(tmp))
        for line in LINES:
            path = line_path(line, "3.12")
            try:
                _resolve(Path(tmp), "3.12", path, f"{wheel}[{','.join(EXTRAS)}]")
                print(f"ok   {path.relative_to(ROOT)} resolves for Python 3.12")
            except subprocess.CalledProcessError:
                failures.append(f"{path.relative_to(ROOT)} does not resolve for Python 3.12")
        for release in IMAGE_RELEASES:
            for python in PYTHONS:
                path = image_path(release, python)
                pinned = pin_map(path.read_text())
                try:
                    got = _resolve(Path(tmp), python, path, f"apache-airflow=={release}", wheel)
                except subprocess.CalledProcessError:
                    failures.append(f"the provider does not install into {path.relative_to(ROOT)}")
                    continue
                changed = sorted(n for n, v in got.items() if n in pinned and pinned[n] != v)
                if changed or got.get("apache-airflow") != release:
                    failures.append(f"{path.relative_to(ROOT)}: install would change {changed}")
                else:
                    added = sorted(n for n in got if n not in pinned)
                    print(f"ok   provider installs into {path.relative_to(ROOT)} (adds only {added})")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("image", help="rebuild a managed image set").add_argument("version")
    line = sub.add_parser("line", help="rebuild a test line's sets")
    line.add_argument("line", choices=LINES)
    line.add_argument(
        "--keep",
        action="store_true",
        help="keep every current pin; resolve only packages new to the set (a new dev dependency)",
    )
    sub.add_parser("check", help="3.12 sets resolve; the provider installs into every image set")
    args = parser.parse_args()
    if args.command == "image":
        make_image(args.version)
    elif args.command == "line":
        make_line(args.line, keep=args.keep)
    else:
        return check()
    return 0


if __name__ == "__main__":
    sys.exit(main())

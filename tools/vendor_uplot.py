"""Fetch and check the plugin UI's vendored charting library, uPlot, at its pinned version.

The UI must work without network access, so uPlot's minified browser build, its stylesheet and its licence
are kept in the package under ``airflow_provider_etl_craft/plugins/ui/vendor/uplot/`` and served by the
plugin itself (docs/ui.md). This script makes that copy reproducible:

* ``fetch`` downloads the pinned release's tarball from the npm registry, checks it against the registry's
  published integrity hash (``dist.integrity``, SHA-512) pinned here, checks each file against the SHA-256
  pinned here, and writes the files into the vendor folder (``make vendor-ui``).
* ``check`` (no network) checks the vendored files against the pinned SHA-256 hashes.

To move to another uPlot release: change :data:`VERSION`, :data:`INTEGRITY` (``npm view uplot@<v>
dist.integrity``) and :data:`FILES`, run ``fetch``, and read the release notes for API changes.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "1.6.32"
TARBALL = f"https://registry.npmjs.org/uplot/-/uplot-{VERSION}.tgz"
#: The registry's ``dist.integrity`` of the tarball.
INTEGRITY = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
#: Vendored file name -> (path inside the tarball, SHA-256 of its bytes).
FILES = {
    "uPlot.iife.min.js": (
        "package/dist/uPlot.iife.min.js",
        "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    ),
    "uPlot.min.css": (
        "package/dist/uPlot.min.css",
        "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    ),
    "LICENSE": ("package/LICENSE", "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd"),
}
VENDOR = (
    Path(__file__).resolve().parents[1] / "airflow_provider_etl_craft" / "plugins" / "ui" / "vendor" / "uplot"
)


def sri(data: bytes) -> str:
    """The Subresource-Integrity form of ``data``'s SHA-512, as npm publishes it."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def fetch(folder: Path = VENDOR) -> None:
    """Download the pinned tarball, check it, and write the vendored files into ``folder``."""
    with urllib.request.urlopen(TARBALL, timeout=60) as response:  # noqa: S310 - a constant https URL
        tarball = response.read()
    if (got := sri(tarball)) != INTEGRITY:
        raise SystemExit(f"uplot {VERSION}: the tarball's integrity is {got}, pinned {INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        found = {}
        for name, (member, digest) in FILES.items():
            handle = archive.extractfile(member)
            if handle is None:
                raise SystemExit(f"uplot {VERSION}: {member} is not a file in the tarball")
            data = handle.read()
            if (got := hashlib.sha256(data).hexdigest()) != digest:
                raise SystemExit(f"uplot {VERSION}: {member} has SHA-256 {got}, pinned {digest}")
            found[name] = data
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in found.items():
        (folder / name).write_bytes(data)
    print(f"uplot {VERSION}: wrote {', '.join(sorted(found))} into {folder}")


def check(folder: Path = VENDOR) -> list[str]:
    """What is wrong with the vendored files (empty: they are the pinned release's)."""
    problems = []
    for name, (_, digest) in FILES.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif (got := hashlib.sha256(path.read_bytes()).hexdigest()) != digest:
            problems.append(f"{path} has SHA-256 {got}, pinned {digest}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["fetch", "check"])
    args = parser.parse_args(argv)
    if args.action == "fetch":
        fetch()
    problems = check()
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"uplot {VERSION}: the vendored files match the pinned hashes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

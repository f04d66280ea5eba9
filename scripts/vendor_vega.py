#!/usr/bin/env python3
"""Vendor vega, vega-lite and vega-embed into site_templates/static/vendor/ (run at build time, not at
site time): `npm pack` fetches the published packages from the npm registry, their minified UMD builds
and licenses are copied, and VERSIONS.json records what came from where with sha256 sums.

The versions follow altair's vega-lite schema (altair 6.x writes v6.4.1 specs). Usage:
    python scripts/vendor_vega.py [--check]
`--check` only verifies the committed files against VERSIONS.json (no network).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = {  # package -> (version, file in the tarball's build/ folder)
    "vega": ("6.2.0", "vega.min.js"),
    "vega-lite": ("6.4.1", "vega-lite.min.js"),
    "vega-embed": ("7.0.2", "vega-embed.min.js"),
}
DEST = Path(__file__).resolve().parent.parent / "site_templates" / "static" / "vendor"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def vendor() -> dict[str, dict[str, str]]:
    DEST.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (version, build_file) in PACKAGES.items():
            out = subprocess.run(
                ["npm", "pack", f"{name}@{version}", "--json", "--pack-destination", tmp],
                check=True, capture_output=True, text=True,
            )
            tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
            with tarfile.open(tarball) as tar:
                tar.extractall(Path(tmp) / name, filter="data")
            package = Path(tmp) / name / "package"
            shutil.copyfile(package / "build" / build_file, DEST / build_file)
            license_name = f"{name}.LICENSE"
            shutil.copyfile(package / "LICENSE", DEST / license_name)
            manifest[name] = {
                "version": version, "file": build_file, "sha256": _sha256(DEST / build_file),
                "license": license_name, "source": f"npm registry, {name}@{version} build/{build_file}",
            }
    (DEST / "VERSIONS.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def check() -> list[str]:
    manifest = json.loads((DEST / "VERSIONS.json").read_text())
    problems = []
    for name, (version, build_file) in PACKAGES.items():
        entry = manifest.get(name, {})
        if entry.get("version") != version:
            problems.append(f"{name}: vendored {entry.get('version')}, wanted {version}")
        elif _sha256(DEST / build_file) != entry.get("sha256"):
            problems.append(f"{name}: {build_file} does not match its recorded sha256")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify the vendored files, fetch nothing")
    args = parser.parse_args()
    if args.check:
        problems = check()
        print("\n".join(problems) or "vendored vega files match VERSIONS.json")
        return 1 if problems else 0
    for name, entry in vendor().items():
        print(f"{name} {entry['version']} -> {DEST / entry['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

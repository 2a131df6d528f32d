#!/usr/bin/env python3
"""Dependencies a crate declares and never names: `make lint` fails on them.

For each workspace member, every [dependencies], [dev-dependencies] and
[build-dependencies] entry must be named (as `name::` or `use name` or `extern crate
name`, dashes as underscores) somewhere in the crate's Rust sources, or be listed in
the crate's `[package.metadata.unused-deps] allow` with the reason it is needed without
being named (a feature switch, a proc-macro's runtime, a binary a test runs).
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def members():
    ws = tomllib.loads((ROOT / "Cargo.toml").read_text())
    for m in ws["workspace"]["members"]:
        yield ROOT / m


def sources(crate: pathlib.Path):
    for p in crate.rglob("*.rs"):
        if "target" not in p.relative_to(crate).parts:
            yield p.read_text(errors="replace")


def main() -> int:
    bad = []
    for crate in members():
        manifest = tomllib.loads((crate / "Cargo.toml").read_text())
        allow = set(
            manifest.get("package", {})
            .get("metadata", {})
            .get("unused-deps", {})
            .get("allow", [])
        )
        text = "\n".join(sources(crate))
        for table in ("dependencies", "dev-dependencies", "build-dependencies"):
            for name, spec in manifest.get(table, {}).items():
                if name in allow:
                    continue
                lib = name
                if isinstance(spec, dict) and "package" in spec:
                    lib = name  # renamed: the key is what code names
                ident = lib.replace("-", "_")
                if not re.search(rf"\b{re.escape(ident)}\s*::|\buse\s+{re.escape(ident)}\b|\bextern\s+crate\s+{re.escape(ident)}\b|#\[{re.escape(ident)}::", text):
                    bad.append(f"{crate.relative_to(ROOT)}: [{table}] {name} is never named")
    for b in bad:
        print(b)
    if bad:
        print("unused dependencies: remove them, or list them in the crate's "
              "[package.metadata.unused-deps] allow with why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

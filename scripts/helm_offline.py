#!/usr/bin/env python3
"""Offline `helm lint` and `helm template` for the chart tests (tests/deploy/).

No helm binary and no cluster: both commands run the Helm v4 Go library shipped in the
PyPI wheel `helm-python-sdk` (`import helm_python`). scripts/test.sh installs it into
target/venv together with kubernetes-validate, which checks what `template` renders.

    python3 scripts/helm_offline.py lint CHART [--strict] [-f VALUES.yaml]... [--set K=V]...
    python3 scripts/helm_offline.py template RELEASE CHART [-n NAMESPACE] [-f VALUES.yaml]... [--set K=V]...

Values are layered as helm does: the chart's own values.yaml (applied by the library),
then each -f file in order, then each --set in order; later ones win, maps merge key by
key. The chart's values.schema.json is enforced by both commands.

`lint` prints one line per finding, `[SEVERITY] path: message`, then a summary that ends
in `0 chart(s) failed` when it passed. With --strict, warnings fail as errors do.

`template` writes every rendered manifest to stdout as `---`-separated YAML documents,
each headed by `# Source: <template path>`, in template-path order; NOTES.txt and
templates that render empty are left out.

Exit status: 0 on success; 1 on lint findings that fail, a render error, or bad values
(the error goes to stderr).
"""
import argparse
import sys

import helm_python as helm

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
WARNING = 2


def merge(into, new):
    """Merges the map `new` into `into`, recursing where both hold a map."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def user_values(files, sets):
    """The -f files, then the --set expressions, merged in order."""
    values = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            merge(values, helm.values_from_yaml(f.read()) or {})
    for expression in sets:
        merge(values, helm.parse_set_string(expression))
    return values


def lint(args, values):
    report = helm.lint(args.chart, values, strict=args.strict or None)
    messages = report.get("messages") or []
    for m in messages:
        severity = SEVERITY.get(m["severity"], str(m["severity"]))
        print(f"[{severity}] {m['path']}: {m['error']}")
    shown = {m["error"] for m in messages}
    for e in report.get("errors") or []:
        if e not in shown:  # the library repeats most findings in both lists
            print(f"[ERROR] {e}")
    failed = bool(report.get("errors")) or any(
        m["severity"] >= (WARNING if args.strict else WARNING + 1) for m in messages
    )
    linted = report.get("total_charts_linted", 0)
    print(f"{linted} chart(s) linted, {'1 chart(s) failed' if failed else '0 chart(s) failed'}")
    return 1 if failed else 0


def template(args, values):
    chart = helm.Chart.load(args.chart)
    rendered = chart.render(
        values, name=args.release, namespace=args.namespace, is_install=True
    )
    for path in sorted(rendered):
        body = rendered[path].strip()
        if path.endswith("NOTES.txt") or not body:
            continue
        sys.stdout.write(f"---\n# Source: {path}\n{body}\n")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lint_cmd = commands.add_parser("lint", help="helm lint")
    lint_cmd.add_argument("chart")
    lint_cmd.add_argument("--strict", action="store_true", help="warnings fail too")
    template_cmd = commands.add_parser("template", help="helm template")
    template_cmd.add_argument("release")
    template_cmd.add_argument("chart")
    template_cmd.add_argument("-n", "--namespace", default="default")
    for cmd in (lint_cmd, template_cmd):
        cmd.add_argument("-f", "--values", action="append", default=[])
        cmd.add_argument("--set", action="append", default=[])
    args = parser.parse_args()

    try:
        values = user_values(args.values, args.set)
        return lint(args, values) if args.command == "lint" else template(args, values)
    except helm.HelmError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

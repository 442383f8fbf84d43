#!/usr/bin/env python3
"""Prints docs/settings.md's table of envoyproxy/ratelimit variables from src/settings/reference.rs
(run it after changing that table; settings::tests checks docs/settings.md against the code)."""
import re
import sys

src = open(sys.argv[1] if len(sys.argv) > 1 else "src/settings/reference.rs").read()
consts = dict(re.findall(r'const (\w+): &str =\s*"((?:[^"\\]|\\.)*)";', src))
entry = re.compile(
    r'\("([A-Z0-9_]+)",\s*(Same|Mapped\(\s*"((?:[^"\\]|\\.)*)"\s*\)|'
    r'(Ignored|Refused)\(\s*(?:"((?:[^"\\]|\\.)*)"|(\w+)),\s*(&\[[^\]]*\]|FALSE)\s*\))\s*\),'
)
for m in entry.finditer(src):
    name, body = m.group(1), m.group(2)
    if body == "Same":
        text = "same"
    elif body.startswith("Mapped"):
        text = "mapped: " + m.group(3)
    else:
        kind, why, ok = m.group(4), m.group(5) or consts[m.group(6)], m.group(7)
        values = "false" if ok == "FALSE" else ", ".join(re.findall(r'"([^"]*)"', ok))
        if kind == "Ignored":
            text = "ignored, with a warning at start" + (f" unless {values}" if values else "")
        else:
            text = "refused" + (f" unless {values}" if values else " when set")
        text += ": " + why
    print(f"| `{name}` | {text} |")

#!/usr/bin/env python3
"""Prints the values table of charts/pullman/README.md from values.yaml: every key documented with
a `# -- ` comment, its type and default. `e2e/chart/test.sh` fails when the README's table differs.

Usage: values-table.py charts/pullman/values.yaml
"""
import json
import re
import sys

import yaml


def main(path):
    values = yaml.safe_load(open(path))
    rows, stack, doc, documented = [], [], None, set()
    for line in open(path):
        comment = re.match(r"^(\s*)# -- (.*)$", line)
        if comment:
            doc = [comment.group(2).strip()]
            continue
        cont = re.match(r"^\s*# ?(.*)$", line)
        if cont:
            if doc is not None and not cont.group(1).startswith("-"):
                doc.append(cont.group(1).strip())
            continue
        key = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9_-]*):", line)
        if not key:
            continue
        depth = len(key.group(1)) // 2
        stack = stack[:depth] + [key.group(2)]
        if doc is None:
            continue
        value = values
        for k in stack:
            value = value[k]
        kind = {bool: "bool", int: "int", str: "string", list: "list", dict: "object"}[type(value)]
        default = json.dumps(value) if not isinstance(value, str) else (f'`"{value}"`' if value else '`""`')
        if not isinstance(value, str):
            default = f"`{default}`"
        text = " ".join(doc).replace("|", "\\|")
        rows.append(f"| `{'.'.join(stack)}` | {kind} | {default} | {text} |")
        documented.add(".".join(stack))
        doc = None
    missing = [p for p in leaves(values) if not any(p == d or p.startswith(d + ".") for d in documented)]
    if missing:
        sys.exit(f"values.yaml: no '# -- ' comment for {', '.join(missing)}")
    print("| key | type | default | description |")
    print("|---|---|---|---|")
    print("\n".join(rows))


def leaves(tree, prefix=""):
    for k, v in tree.items():
        path = prefix + k
        if isinstance(v, dict) and v:
            yield from leaves(v, path + ".")
        else:
            yield path


if __name__ == "__main__":
    main(sys.argv[1])

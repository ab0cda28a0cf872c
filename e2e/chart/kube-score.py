#!/usr/bin/env python3
"""Compares kube-score's findings on the rendered chart with the findings the chart README keeps.

Usage: kube-score.py README.md MODE=KUBE_SCORE_JSON RELEASE ...   (repeated triples)

A finding is a check kube-score grades below "all OK" (warning or critical) on one object in one
mode; object names have the release's full name replaced by `<fullname>`. The README lists each
kept finding once, as a row `| check | object | modes | why |` between the `kube-score` markers,
`modes` naming every mode where it occurs. Fails on a finding the README does not list, and on a
row that no longer occurs (a fixed finding must leave the README too).
"""
import json
import re
import sys

GRADES = {1: "critical", 5: "warning", 7: "ok-ish", 10: "ok"}


def found(mode, path, release):
    out = set()
    for obj in json.load(open(path)):
        name = obj["object_meta"]["name"].replace(release, "<fullname>")
        what = f'{obj["type_meta"]["kind"]} {name}'
        for check in obj["checks"]:
            if check["skipped"] or check["grade"] >= 7:
                continue
            out.add((check["check"]["id"], what, mode))
            for c in check.get("comments") or []:
                print(f"  {mode}: {check['check']['id']} {GRADES.get(check['grade'])} on {what}: {c['summary']}")
    return out


def kept(readme):
    text = open(readme).read()
    block = re.search(r"<!-- kube-score:.*?-->\n(.*?)<!-- end kube-score -->", text, re.S)
    if not block:
        sys.exit(f"{readme}: no kube-score block")
    out = set()
    for line in block.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        check, what, modes = (re.sub(r"`", "", c) for c in cells[:3])
        for mode in modes.split(", "):
            out.add((check, what, mode))
    return out


def main(readme, *args):
    actual = set()
    for i in range(0, len(args), 2):
        mode, path = args[i].split("=", 1)
        actual |= found(mode, path, args[i + 1])
    listed = kept(readme)
    new, gone = sorted(actual - listed), sorted(listed - actual)
    for f in new:
        print(f"kube-score: not fixed and not listed in the README: {f}", file=sys.stderr)
    for f in gone:
        print(f"kube-score: listed in the README but no longer found: {f}", file=sys.stderr)
    if new or gone:
        sys.exit(1)
    print(f"kube-score: {len(actual)} findings, each listed in the README with its reason")


if __name__ == "__main__":
    main(*sys.argv[1:])

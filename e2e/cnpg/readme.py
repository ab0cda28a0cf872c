#!/usr/bin/env python3
"""The CloudNativePG section of charts/pullman/README.md as e2e/cnpg runs it, so that the text
users copy is the text CI runs (issue #41). Reads the section's one `sh` block:

  readme.py namespace             the namespace it creates (`kubectl create namespace NS`)
  readme.py labels                its `kubectl label namespace` labels, one KEY=VALUE a line
  readme.py cluster OVERRIDES     the Cluster it applies, with the JSON object OVERRIDES merged
                                  into it (the test's image, placement, volumes), as YAML
  readme.py helm                  the arguments of its `helm install pullman charts/pullman`,
                                  one a line

Fails naming what it did not find, should the README's block change shape.
"""
import json
import os
import shlex
import sys

import yaml

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "charts", "pullman", "README.md")


def block():
    text = open(README).read()
    start = text.find("kind: Cluster")
    if start < 0:
        sys.exit(f"readme.py: no Cluster in {README}")
    begin = text.rfind("```sh\n", 0, start)
    end = text.find("```\n", start)
    if begin < 0 or end < 0:
        sys.exit(f"readme.py: the Cluster in {README} is not in a ```sh block")
    return text[begin + len("```sh\n"):end]


def commands(sh):
    """Shell commands with their continuation lines joined; heredoc bodies kept apart."""
    out, lines, i = [], sh.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        out.append(line)
        i += 1
    return out


def merge(base, extra):
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def main():
    sh = block()
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    lines = commands(sh)
    if what == "namespace":
        for line in lines:
            words = shlex.split(line) if line.startswith("kubectl create namespace") else []
            if words:
                print(words[3])
                return
        sys.exit("readme.py: no `kubectl create namespace` in the README's block")
    if what == "labels":
        for line in lines:
            if line.startswith("kubectl label namespace"):
                for word in shlex.split(line)[4:]:
                    print(word)
        return
    if what == "cluster":
        body = sh[sh.index("<<'YAML'\n") + len("<<'YAML'\n"):sh.index("\nYAML\n")]
        cluster = yaml.safe_load(body)
        if cluster.get("kind") != "Cluster":
            sys.exit("readme.py: the README's heredoc is not a Cluster")
        print(yaml.safe_dump(merge(cluster, json.loads(sys.argv[2])), sort_keys=False), end="")
        return
    if what == "helm":
        for line in lines:
            if line.startswith("helm install pullman charts/pullman"):
                for word in shlex.split(line)[4:]:
                    print(word)
                return
        sys.exit("readme.py: no `helm install pullman charts/pullman` in the README's block")
    sys.exit(__doc__)


if __name__ == "__main__":
    main()

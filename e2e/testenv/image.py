#!/usr/bin/env python3
"""Write a one-layer image as a docker-archive tar (what `docker save` writes and
`ctr images import` reads), from a directory that holds its whole file system.

The layer is reproducible: entries sorted, owned by root, mtime 0. With --dockerfile, USER,
ENTRYPOINT and CMD come from that file's last stage (so the test image cannot disagree with the
Dockerfile users build); otherwise from --user/--entrypoint/--cmd (JSON arrays).

Usage: image.py --tag localhost/busybox:dev --rootfs DIR [--cmd '["sh"]'] -o image.tar
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def dockerfile_config(path):
    """USER, ENTRYPOINT and CMD of the last stage of a Dockerfile (exec form only)."""
    cfg, stage = {}, []
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = []
        stage.append((word, rest.strip()))
    for word, rest in stage:
        if word == "USER":
            cfg["User"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)  # shell form would need a shell the image does not have
            cfg["Entrypoint" if word == "ENTRYPOINT" else "Cmd"] = value
    return cfg


def layer(rootfs):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--dockerfile")
    ap.add_argument("--user")
    ap.add_argument("--entrypoint")
    ap.add_argument("--cmd")
    ap.add_argument("--path", help="the image's PATH (default: the usual system directories)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    cfg = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    if a.path:
        cfg["Env"] = ["PATH=" + a.path]
    if a.dockerfile:
        cfg.update(dockerfile_config(a.dockerfile))
    if a.user:
        cfg["User"] = a.user
    if a.entrypoint:
        cfg["Entrypoint"] = json.loads(a.entrypoint)
    if a.cmd:
        cfg["Cmd"] = json.loads(a.cmd)

    data = layer(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "e2e/testenv/image.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [a.tag], "Layers": ["layer.tar"]}]).encode()

    with tarfile.open(a.output, "w") as out:
        for name, body in (("layer.tar", data), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            out.addfile(info, io.BytesIO(body))


if __name__ == "__main__":
    main()

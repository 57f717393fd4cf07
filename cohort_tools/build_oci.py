"""Builds Cohort's two OCI images without Docker or a base image, as OCI image layout
directories: the filter (`cohort-filter`, the Wasm module Istio pulls) and the batcher
(`cohort`, `cohort serve`). Both go through one path: a reproducible single-layer tar
(sorted entries, owner 0:0, dated 1970), gzip without a timestamp, sha256 digests, an image
config, a manifest and index.json. The same inputs always give the same manifest digest.

- **filter**: Istio's "compat" Wasm variant, one application/vnd.oci.image.layer.v1.tar+gzip
  layer holding only plugin.wasm (WasmPlugin `url: oci://...`, or the EnvoyFilter's ECDS).
- **batcher**: the `cohort` binary at /opt/cohort/bin/cohort; the shared libraries `ldd`
  lists for it, copied from this machine's Debian with the dynamic loader, at the same paths
  (the /lib → usr/lib links included); each `--lib` in /usr/lib, with what `ldd` lists for
  it; the inspector page's wasm build at /opt/cohort/ui/pkg/ (the binary finds it as
  ../ui); /etc/passwd and /etc/group with the non-root user 65532 (`nonroot`),
  /etc/nsswitch.conf, and the empty mount points /dev, /proc, /sys, /tmp, /etc/cohort. No
  CA certificates: the batcher speaks plain HTTP to the engines and gRPC to the filters,
  and Istio's sidecar carries mTLS. Entrypoint `cohort serve`, Cmd `--config
  /etc/cohort/cohort.toml` (the ConfigMap the manifests mount there), user 65532:65532.

    scripts/build-oci                     # both: target/oci/cohort-filter/, target/oci/cohort/
    scripts/build-oci filter --wasm PATH --out DIR --tag TAG
    scripts/build-oci batcher --pin       # and write its digest into istio/image/kustomization.yaml
    scripts/build-oci batcher --binary target/release/cohort --lib /path/libnvrtc.so.13 \\
        --lib /path/libnvrtc-builtins.so.13.0 --name cohort-cuda --pin istio/gpu/kustomization.yaml

Push with any OCI tool, keeping the digest (docs/ISTIO.md):
    oras cp --from-oci-layout target/oci/cohort:0.1.0 registry.example.com/cohort/cohort:0.1.0
    skopeo copy --preserve-digests oci:target/oci/cohort:0.1.0 docker://registry.example.com/cohort/cohort:0.1.0
    crane push target/oci/cohort registry.example.com/cohort/cohort:0.1.0
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import pathlib
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

# The batcher image's fixed parts.
USER = "65532:65532"
BINARY = "/opt/cohort/bin/cohort"
CONFIG_PATH = "/etc/cohort/cohort.toml"
ENTRYPOINT = [BINARY, "serve"]
CMD = ["--config", CONFIG_PATH]
PATH_ENV = "PATH=/opt/cohort/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PORTS = ["50051/tcp", "9464/tcp", "8000/tcp"]
UI_FILES = ["cohort_fingerprint_web.js", "cohort_fingerprint_web_bg.wasm"]
ETC = {
    "etc/passwd": b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
    b"nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": b"root:x:0:\nnonroot:x:65532:\n",
    "etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files dns\n",
}
# ELF e_machine → OCI architecture.
ARCHITECTURES = {62: "amd64", 183: "arm64"}
# The kustomization the batcher image is pinned in by default.
KUSTOMIZATION = ROOT / "istio/image/kustomization.yaml"


def workspace_version():
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


class Tree:
    """The files of one layer: path (relative, no leading /) → (type, mode, data or target)."""

    def __init__(self):
        self.entries = {}

    def _put(self, path, entry):
        path = path.strip("/")
        if self.entries.get(path, entry) != entry:
            sys.exit(f"build-oci: {path} added twice, differently")
        self.entries[path] = entry

    def directory(self, path, mode=0o755):
        self._put(path, (tarfile.DIRTYPE, mode, None))

    def parents(self, path):
        parent = posixpath.dirname(path.strip("/"))
        while parent:
            self.directory(parent)
            parent = posixpath.dirname(parent)

    def file(self, path, data, mode=0o644):
        self.parents(path)
        self._put(path, (tarfile.REGTYPE, mode, data))

    def symlink(self, path, target):
        self.parents(path)
        self._put(path, (tarfile.SYMTYPE, 0o777, target))

    def host_file(self, host_path):
        """Copies a file of this machine to the same path, keeping the symbolic links on the
        way (Debian's /lib → usr/lib, /lib64/ld-linux-x86-64.so.2 → ...) as links."""
        path = posixpath.normpath(str(host_path))
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if os.path.islink(prefix):
                target = os.readlink(prefix)
                self.symlink(prefix, target)
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target))
                return self.host_file(posixpath.join(resolved, *parts[i:]))
        data = pathlib.Path(path).read_bytes()
        self.file(path, data, mode=os.stat(path).st_mode & 0o755)

    def tar(self):
        """The layer: entries sorted by path, owned by 0:0 with no names, dated 1970."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, mode, payload = self.entries[path]
                info = tarfile.TarInfo(path)
                info.type, info.mode, info.mtime = kind, mode, 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if kind == tarfile.SYMTYPE:
                    info.linkname = payload
                if kind == tarfile.REGTYPE:
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                else:
                    tar.addfile(info)
        return buffer.getvalue()


class Layout:
    """An OCI image layout directory: oci-layout, index.json, blobs/sha256/<digest>."""

    def __init__(self, out):
        self.out = out
        if out.exists():
            shutil.rmtree(out)
        (out / "blobs" / "sha256").mkdir(parents=True)

    def blob(self, media_type, data):
        digest = hashlib.sha256(data).hexdigest()
        (self.out / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def finish(self, manifest, tag):
        manifest = dict(manifest, annotations={"org.opencontainers.image.ref.name": tag})
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [manifest]}
        (self.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        (self.out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}) + "\n")


def encode(document):
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def write_image(out, tag, tree, platform, config, title, description):
    """The one path both images take: layer, config, manifest, index. Returns the
    manifest descriptor (its digest is the image's)."""
    tar = tree.tar()
    layout = Layout(out)
    layer = layout.blob(LAYER, gzip.compress(tar, compresslevel=9, mtime=0))
    config_blob = layout.blob(CONFIG, encode(dict(platform, config=config, rootfs={
        "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]})))
    manifest = layout.blob(MANIFEST, encode({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config_blob,
        "layers": [layer],
        "annotations": {
            "org.opencontainers.image.title": title,
            "org.opencontainers.image.description": description,
            "org.opencontainers.image.version": tag,
        },
    }))
    layout.finish(manifest, tag)
    return manifest


def build_filter(wasm_path, out, tag):
    wasm = wasm_path.read_bytes()
    if wasm[:4] != b"\0asm":
        sys.exit(f"build-oci: {wasm_path} is not a wasm module")
    tree = Tree()
    tree.file("plugin.wasm", wasm)
    manifest = write_image(out, tag, tree, {"architecture": "wasm", "os": "wasi"}, {},
                           "cohort-filter", "Cohort proxy-wasm filter for Envoy and Istio")
    print(f"build-oci: {out} ({tag}): manifest {manifest['digest']}, plugin.wasm {len(wasm)} bytes")
    return manifest


def architecture(binary):
    header = binary.read_bytes()[:20]
    if header[:4] != b"\x7fELF":
        sys.exit(f"build-oci: {binary} is not an ELF executable")
    machine = int.from_bytes(header[18:20], "little")
    if machine not in ARCHITECTURES:
        sys.exit(f"build-oci: {binary}: unknown ELF machine {machine}")
    return ARCHITECTURES[machine]


def needed_libraries(path):
    """The shared objects `ldd` resolves for `path` (the loader included), as host paths."""
    result = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    if "statically linked" in result.stdout + result.stderr:
        return []
    if result.returncode != 0:
        sys.exit(f"build-oci: ldd {path}: {result.stderr.strip()}")
    libraries = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            sys.exit(f"build-oci: {path}: {line}")
        match = re.match(r"(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$", line)
        if match:
            libraries.append(match.group(1))
    return libraries


def build_batcher(binary, libs, ui, out, tag, name):
    tree = Tree()
    tree.file(BINARY.lstrip("/"), binary.read_bytes(), mode=0o755)
    for lib in libs:
        # Under its own name in /usr/lib (on the loader's default path), its links followed:
        # the GPU store dlopens libnvrtc.so.13 by name, wherever the toolkit or wheel keeps it.
        lib = pathlib.Path(lib)
        tree.file(f"usr/lib/{lib.name}", lib.read_bytes(), mode=lib.stat().st_mode & 0o755)
    for path in [binary, *libs]:
        for library in needed_libraries(path):
            tree.host_file(library)
    if ui and all((ui / f).is_file() for f in UI_FILES):
        for f in UI_FILES:
            tree.file(f"opt/cohort/ui/pkg/{f}", (ui / f).read_bytes())
    else:
        print(f"build-oci: no inspector build in {ui} (scripts/build-wasm): the image's /ui page "
              "will lack its playground", file=sys.stderr)
    for path, data in ETC.items():
        tree.file(path, data)
    tree.directory(posixpath.dirname(CONFIG_PATH).lstrip("/"))
    tree.directory("tmp", 0o1777)
    # Mount points the runtime fills (a runtime creates missing ones; a read-only rootfs
    # under bubblewrap, as in the tests, needs them there).
    for mount in ["dev", "proc", "sys"]:
        tree.directory(mount, 0o555 if mount != "dev" else 0o755)
    config = {
        "User": USER,
        "Entrypoint": ENTRYPOINT,
        "Cmd": CMD,
        "WorkingDir": "/",
        "Env": [PATH_ENV],
        "ExposedPorts": {port: {} for port in PORTS},
    }
    manifest = write_image(out, tag, tree, {"architecture": architecture(binary), "os": "linux"},
                           config, name, "Cohort batcher (cohort serve)")
    print(f"build-oci: {out} ({tag}): manifest {manifest['digest']}, {binary.name} "
          f"{binary.stat().st_size} bytes, {len(tree.entries)} entries")
    return manifest


def pin(kustomization, name, digest):
    """Writes `digest` into the `images:` entry of `kustomization` for image `name`: the one
    whose newName ends in /<name> (or whose name is <name>). Comments and order are kept."""
    lines = kustomization.read_text().splitlines(keepends=True)
    entries = [i for i, line in enumerate(lines) if re.match(r"- name: ", line)]
    for start in entries:
        end = start + 1
        while end < len(lines) and lines[end].startswith("  "):
            end += 1
        fields = {m.group(1): m.group(2) for line in lines[start:end]
                  if (m := re.match(r"(?:- |  )(\w+): (\S+)", line))}
        if fields.get("newName", "").rsplit("/", 1)[-1] == name or fields.get("name") == name:
            body = [line for line in lines[start + 1:end] if not line.startswith("  digest:")]
            lines[start + 1:end] = body + [f"  digest: {digest}\n"]
            kustomization.write_text("".join(lines))
            print(f"build-oci: pinned {name} at {digest} in {kustomization}")
            return
    sys.exit(f"build-oci: {kustomization}: no images: entry for {name}")


def main():
    parser = argparse.ArgumentParser(prog="build-oci", description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="*", metavar="filter|batcher",
                        help="which images (default: both)")
    parser.add_argument("--wasm", type=pathlib.Path, default=ROOT / "target/wasm/cohort_filter.wasm",
                        help="filter: the module (scripts/build-wasm)")
    parser.add_argument("--binary", type=pathlib.Path, default=ROOT / "target/release/cohort",
                        help="batcher: the cohort binary (cargo build --release -p cohort-cli)")
    parser.add_argument("--lib", action="append", default=[], metavar="PATH",
                        help="batcher: one more shared library to carry, with what it needs "
                        "(the GPU store's libnvrtc; repeat)")
    parser.add_argument("--ui", type=pathlib.Path, default=ROOT / "target/ui/pkg",
                        help="batcher: the inspector's wasm build (scripts/build-wasm)")
    parser.add_argument("--name", default="cohort", help="batcher: the image name (default cohort)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="the layout directory (one image only; default target/oci/<name>)")
    parser.add_argument("--tag", default=None, help="image tag (default: the workspace version)")
    parser.add_argument("--pin", type=pathlib.Path, nargs="?", const=KUSTOMIZATION, default=None,
                        metavar="KUSTOMIZATION", help="batcher: write its digest into the images: "
                        "entry of KUSTOMIZATION (default istio/image/kustomization.yaml)")
    args = parser.parse_args()
    images = args.images or ["filter", "batcher"]
    if not set(images) <= {"filter", "batcher"}:
        parser.error(f"images are filter and batcher, not {' '.join(images)}")
    if args.out and len(images) > 1:
        parser.error("--out needs one image: filter or batcher")
    if args.pin and "batcher" not in images:
        parser.error("--pin pins the batcher image")
    tag = args.tag or workspace_version()
    if "filter" in images:
        if not args.wasm.is_file():
            sys.exit(f"build-oci: {args.wasm} missing; build it with scripts/build-wasm")
        build_filter(args.wasm, args.out or ROOT / "target/oci/cohort-filter", tag)
    if "batcher" in images:
        if not args.binary.is_file():
            sys.exit(f"build-oci: {args.binary} missing; build it with "
                     "cargo build --release --locked -p cohort-cli")
        manifest = build_batcher(args.binary, args.lib, args.ui,
                                 args.out or ROOT / "target/oci" / args.name, tag, args.name)
        if args.pin:
            pin(args.pin, args.name, manifest["digest"])


if __name__ == "__main__":
    main()

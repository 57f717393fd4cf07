"""Packs the Cohort filter as an OCI image that Istio pulls (WasmPlugin `url: oci://...`, or
an EnvoyFilter served by ECDS), without Docker: an OCI image layout directory.

The image is Istio's "compat" variant: one layer, application/vnd.oci.image.layer.v1.tar+gzip,
a tar holding only plugin.wasm. Built reproducibly (fixed timestamps and owners), so the
same module always gives the same image digest.

    scripts/build-wasm && scripts/build-oci        # target/oci/cohort-filter/, tag = version
    scripts/build-oci --wasm PATH --out DIR --tag TAG

Push it with any OCI tool (docs/ISTIO.md):
    oras cp --from-oci-layout target/oci/cohort-filter:0.1.0 registry.example.com/cohort/cohort-filter:0.1.0
    skopeo copy oci:target/oci/cohort-filter:0.1.0 docker://registry.example.com/cohort/cohort-filter:0.1.0
    crane push target/oci/cohort-filter registry.example.com/cohort/cohort-filter:0.1.0
"""

import argparse
import gzip
import hashlib
import io
import json
import pathlib
import re
import shutil
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def workspace_version():
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def layer_tar(wasm):
    """A tar with plugin.wasm alone, owned by root, dated 1970: the same bytes every time."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(wasm))
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


def build(wasm_path, out, tag):
    wasm = wasm_path.read_bytes()
    if wasm[:4] != b"\0asm":
        sys.exit(f"build-oci: {wasm_path} is not a wasm module")
    tar = layer_tar(wasm)
    layout = Layout(out)
    layer = layout.blob(LAYER, gzip.compress(tar, compresslevel=9, mtime=0))
    config = layout.blob(CONFIG, encode({
        "architecture": "wasm",
        "os": "wasi",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
    }))
    manifest = layout.blob(MANIFEST, encode({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config,
        "layers": [layer],
        "annotations": {
            "org.opencontainers.image.title": "cohort-filter",
            "org.opencontainers.image.description": "Cohort proxy-wasm filter for Envoy and Istio",
            "org.opencontainers.image.version": tag,
        },
    }))
    layout.finish(manifest, tag)
    print(f"build-oci: {out} ({tag}): manifest {manifest['digest']}, plugin.wasm {len(wasm)} bytes")


def main():
    parser = argparse.ArgumentParser(prog="build-oci", description=__doc__.split("\n\n")[0])
    parser.add_argument("--wasm", type=pathlib.Path, default=ROOT / "target/wasm/cohort_filter.wasm")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "target/oci/cohort-filter")
    parser.add_argument("--tag", default=None, help="image tag (default: the workspace version)")
    args = parser.parse_args()
    if not args.wasm.is_file():
        sys.exit(f"build-oci: {args.wasm} missing; build it with scripts/build-wasm")
    build(args.wasm, args.out, args.tag or workspace_version())


if __name__ == "__main__":
    main()

"""Unit tests of cohort_tools.build_oci (scripts/build-oci): both images go through one
reproducible path, the batcher image carries what its binary needs and runs as non-root,
and --pin writes the digest into a kustomization. The batcher image runs for real in
tests/tests/e2e/batcher_image.rs."""
import gzip
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

from cohort_tools import build_oci

BINARY = pathlib.Path(shutil.which("true") or "/bin/true").resolve()


def image(out):
    """(index, manifest, config, layer tar members) of the layout at `out`."""
    index = json.loads((out / "index.json").read_text())

    def blob(descriptor):
        return (out / "blobs/sha256" / descriptor["digest"].split(":")[1]).read_bytes()

    manifest = json.loads(blob(index["manifests"][0]))
    config = json.loads(blob(manifest["config"]))
    layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(manifest["layers"][0]))))
    return index, manifest, config, layer.getmembers()


class BuildOciTests(unittest.TestCase):
    def setUp(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="cohort-build-oci-"))
        self.addCleanup(shutil.rmtree, self.dir)

    def batcher(self, name, **kwargs):
        out = self.dir / name
        build_oci.build_batcher(BINARY, kwargs.get("libs", []), kwargs.get("ui", self.dir / "no-ui"),
                                out, "t", "cohort")
        return out

    def test_the_batcher_image_is_reproducible_and_runs_cohort_serve_as_non_root(self):
        first, again = self.batcher("a"), self.batcher("b")
        self.assertEqual((first / "index.json").read_text(), (again / "index.json").read_text())
        _, manifest, config, members = image(first)
        self.assertEqual(config["os"], "linux")
        self.assertEqual(config["config"]["User"], "65532:65532")
        self.assertEqual(config["config"]["Entrypoint"], ["/opt/cohort/bin/cohort", "serve"])
        self.assertEqual(config["config"]["Cmd"], ["--config", "/etc/cohort/cohort.toml"])
        names = [m.name for m in members]
        self.assertEqual(names, sorted(names))
        self.assertTrue(all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members))
        self.assertIn("opt/cohort/bin/cohort", names)
        self.assertIn("etc/passwd", names)
        self.assertIn("etc/cohort", names)
        # The loader and libc that ldd lists, wherever this machine keeps them.
        self.assertTrue(any(n.endswith("/libc.so.6") for n in names), names)
        self.assertTrue(any("ld-linux" in n for n in names), names)
        passwd = next(m for m in members if m.name == "etc/passwd")
        self.assertEqual(passwd.mode, 0o644)
        self.assertEqual(manifest["annotations"]["org.opencontainers.image.title"], "cohort")

    def test_extra_libraries_go_to_usr_lib_under_their_own_name(self):
        lib = self.dir / "libextra.so.1"
        shutil.copy(next(pathlib.Path("/").glob("*lib*/*-linux-gnu/libm.so.6")), lib)
        _, _, _, members = image(self.batcher("with-lib", libs=[lib]))
        self.assertIn("usr/lib/libextra.so.1", [m.name for m in members])

    def test_the_filter_image_is_one_layer_holding_plugin_wasm(self):
        wasm = self.dir / "f.wasm"
        wasm.write_bytes(b"\0asm\1\0\0\0")
        build_oci.build_filter(wasm, self.dir / "filter", "t")
        _, manifest, config, members = image(self.dir / "filter")
        self.assertEqual(config["architecture"], "wasm")
        self.assertEqual([m.name for m in members], ["plugin.wasm"])
        self.assertEqual(len(manifest["layers"]), 1)

    def test_pin_writes_the_digest_into_the_images_entry(self):
        kustomization = self.dir / "kustomization.yaml"
        shutil.copy(build_oci.KUSTOMIZATION, kustomization)
        digest = "sha256:" + "ab" * 32
        build_oci.pin(kustomization, "cohort", digest)
        build_oci.pin(kustomization, "cohort", digest)
        text = kustomization.read_text()
        self.assertEqual(text.count("digest:"), 1)
        self.assertIn(f"  newTag: 0.1.0\n  digest: {digest}\n", text)
        original = build_oci.KUSTOMIZATION.read_text()
        # Only the digest line differs: comments and order are kept.
        strip = [line for line in text.splitlines() if "digest:" not in line]
        self.assertEqual(strip, [line for line in original.splitlines() if "digest:" not in line])

    def test_the_command_line_builds_one_image_at_a_time_with_out(self):
        result = subprocess.run([sys.executable, "-m", "cohort_tools.build_oci", "--out", str(self.dir)],
                                capture_output=True, text=True, cwd=build_oci.ROOT)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--out needs one image", result.stderr)


if __name__ == "__main__":
    unittest.main()

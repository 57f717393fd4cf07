//! The batcher's OCI image as the manifests deploy it: `scripts/build-oci batcher` packs the
//! `cohort` binary of this checkout (the tests' build, its debug information stripped)
//! into a temporary image layout, `umoci raw unpack`
//! turns it into a root filesystem, and bubblewrap runs it the way Kubernetes would run the
//! rendered StatefulSet's container: the image's entrypoint with the container's args, as
//! the image's non-root user, the rootfs read-only, the overlay's rendered ConfigMap mounted
//! read-only at the container's mountPath, HOSTNAME the pod's name (the shard ordinal).
//!
//! - the image config names a non-root user and `cohort serve` as its entrypoint, and its
//!   default arguments read the file the manifests mount;
//! - for the assign overlay (and batch and gpu, which ship their own file or arguments), the
//!   batcher in the image answers its readiness probe (`/readyz`) and an Assign over gRPC
//!   with one of the replicas the configuration names: for assign and gpu, which discover
//!   the engines from their headless Service, one of the pods a real DNS server (dnsmasq,
//!   serving the shipped Service name) lists, with that pod's `ip:port` as the endpoint.
//!
//! Needs `scripts/setup` (umoci, bubblewrap, kubectl) and the `cohort` binary (built by
//! `cargo test --workspace`).

use cohort_proto::{AssignReply, AssignRequest, Fingerprint, Message, RequestInfo};
use cohort_tests::dns::{engine_pods, Dnsmasq};
use cohort_tests::manifests::{batcher_config, find, render};
use cohort_tests::{
    client, eventually, free_port, h2, port_was_taken, with_port_retries, workspace,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const UMOCI: &str = "/usr/bin/umoci";
const BWRAP: &str = "/usr/bin/bwrap";

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The blob a descriptor points to in an image layout.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// Builds the batcher image of `binary` into `layout` with scripts/build-oci and returns its
/// image config (the `config` object: Entrypoint, Cmd, User, Env, WorkingDir).
fn build_image(binary: &Path, layout: &Path) -> Value {
    let status = Command::new(workspace().join("scripts/build-oci"))
        .arg("batcher")
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(layout)
        .args(["--tag", "test"])
        .status()
        .expect("scripts/build-oci runs");
    assert!(status.success(), "scripts/build-oci batcher failed");
    let index = json_file(&layout.join("index.json"));
    let manifest = json_file(&blob(layout, &index["manifests"][0]));
    let config = json_file(&blob(layout, &manifest["config"]));
    assert_eq!(config["os"], "linux");
    config["config"].clone()
}

fn unpack(layout: &Path, rootfs: &Path) {
    let output = Command::new(UMOCI)
        .args(["raw", "unpack", "--rootless", "--image"])
        .arg(format!("{}:test", layout.display()))
        .arg(rootfs)
        .output()
        .unwrap_or_else(|e| panic!("{UMOCI}: {e} (scripts/setup installs umoci)"));
    assert!(
        output.status.success(),
        "umoci raw unpack: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// What Kubernetes runs for `container` in `image`: the container's command, else the
/// image's Entrypoint; then the container's args, else (without a command) the image's Cmd.
fn kubernetes_argv(image: &Value, container: &Value) -> Vec<String> {
    let command = strings(&container["command"]);
    let args = strings(&container["args"]);
    let mut argv = if command.is_empty() {
        strings(&image["Entrypoint"])
    } else {
        command.clone()
    };
    if !args.is_empty() {
        argv.extend(args);
    } else if command.is_empty() {
        argv.extend(strings(&image["Cmd"]));
    }
    argv
}

/// `shipped` with its listen addresses on free loopback ports, every static replica url at a
/// loopback port where nothing listens, and discovery asking `resolver` (the test's DNS
/// server, which serves the shipped Service name). That is the only change: the test shares
/// this machine's network with every other test, so the fixed ports the manifests use
/// (50051, 9464, 8000, on 0.0.0.0) could be taken, and the cluster's DNS (kube-dns, in the
/// pod's /etc/resolv.conf) is not here. Returns the changed file and the gRPC and HTTP ports.
fn adapt(shipped: &str, resolver: Option<&str>) -> (String, u16, u16) {
    let mut config: toml::Table = shipped.parse().expect("the shipped cohort.toml is TOML");
    let (grpc, http) = (free_port(), free_port());
    config.insert("grpc_listen".into(), format!("127.0.0.1:{grpc}").into());
    config.insert("http_listen".into(), format!("127.0.0.1:{http}").into());
    if let Some(batch) = config.get_mut("batch").and_then(|b| b.as_table_mut()) {
        batch.insert("listen".into(), format!("127.0.0.1:{}", free_port()).into());
    }
    if let (Some(discovery), Some(resolver)) = (
        config.get_mut("discovery").and_then(|d| d.as_table_mut()),
        resolver,
    ) {
        discovery.insert("resolver".into(), resolver.into());
    }
    let replicas = config.get_mut("replicas").and_then(|r| r.as_array_mut());
    for replica in replicas.into_iter().flatten() {
        let replica = replica.as_table_mut().unwrap();
        if replica.contains_key("url") {
            replica.insert(
                "url".into(),
                format!("http://127.0.0.1:{}", free_port()).into(),
            );
        }
    }
    (toml::to_string(&config).unwrap(), grpc, http)
}

/// The image's root filesystem running one command under bubblewrap; killed when dropped.
struct Sandbox {
    child: Child,
    log: PathBuf,
}

impl Sandbox {
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // Without the terminal colours of the log lines.
        let mut plain = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().take_while(|c| *c != 'm').for_each(drop);
            } else {
                plain.push(c);
            }
        }
        plain
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // bwrap --die-with-parent takes the sandboxed process with it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Runs `argv` in `rootfs` as Kubernetes would run the container: as `user` ("uid:gid"),
/// the rootfs read-only, `config_dir` mounted read-only at `mount`, the image's Env with the
/// container's env over it and HOSTNAME the pod's name, in the image's WorkingDir.
struct Run<'a> {
    rootfs: &'a Path,
    user: &'a str,
    argv: &'a [String],
    env: Vec<(String, String)>,
    workdir: &'a str,
    config_dir: &'a Path,
    mount: &'a str,
}

impl Run<'_> {
    fn start(self, log: PathBuf) -> Sandbox {
        let (uid, gid) = self.user.split_once(':').expect("uid:gid");
        let mut command = Command::new("setpriv");
        command
            .args([&format!("--reuid={uid}"), &format!("--regid={gid}")])
            .arg("--clear-groups")
            .arg(BWRAP)
            .arg("--ro-bind")
            .arg(self.rootfs)
            .arg("/")
            .arg("--ro-bind")
            .arg(self.config_dir)
            .arg(self.mount)
            .args(["--proc", "/proc", "--dev", "/dev"])
            .args(["--unshare-pid", "--die-with-parent", "--clearenv"])
            .args(["--chdir", self.workdir]);
        for (name, value) in &self.env {
            command.args(["--setenv", name, value]);
        }
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .arg("--")
            .args(self.argv)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("setpriv + {BWRAP}: {e} (scripts/setup installs bubblewrap)")
            });
        Sandbox { child, log }
    }
}

/// One Assign as the filter sends it (cohort.v1.Batcher/Assign over h2c, a gRPC frame of
/// the prost message), and the batcher's reply.
fn try_assign(port: u16) -> Result<AssignReply, String> {
    let request = AssignRequest {
        request: Some(RequestInfo {
            fingerprint: Some(Fingerprint {
                key: 0x3f2a_9c0d_1e4b_5a67,
                prefix: 0x1234_5678_9abc_def0,
                blocks: vec![11, 22, 33, 44],
                prompt_bytes: 1024,
                block_bytes: 256,
                ..Fingerprint::default()
            }),
            tenant: "image-test".into(),
            path: "/v1/chat/completions".into(),
            model: "gemma-3-270m".into(),
            request_id: "batcher-image-1".into(),
            mode: "assign".into(),
            ..RequestInfo::default()
        }),
        ..AssignRequest::default()
    };
    let message = request.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let response = h2::send(
        port,
        h2::Request {
            method: "POST".into(),
            path: format!("/{}/{}", cohort_proto::SERVICE, cohort_proto::METHOD_ASSIGN),
            headers: vec![
                ("content-type".into(), b"application/grpc".to_vec()),
                ("te".into(), b"trailers".to_vec()),
            ],
            pieces: vec![frame],
            ..h2::Request::default()
        },
    )
    .expect("the Assign call completes");
    assert_eq!(response.status, 200);
    if response.header("grpc-status").is_some_and(|s| s != "0") {
        return Err(format!(
            "grpc-status {:?}: {:?}",
            response.header("grpc-status"),
            response.header("grpc-message")
        ));
    }
    let body = &response.body;
    assert!(
        body.len() >= 5 && body[0] == 0,
        "not one gRPC frame: {body:?}"
    );
    let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    Ok(AssignReply::decode(&body[5..5 + length]).expect("an AssignReply"))
}

/// The binary the image packs: this checkout's, the one the tests run (`cargo test
/// --workspace` builds it), with its debug information removed (`objcopy --strip-debug`,
/// into `dir`) as the release build the image ships has none, so the layer stays the size
/// of the shipped one and packs in seconds.
fn binary_to_pack(dir: &Path) -> PathBuf {
    let stripped = dir.join("cohort");
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(cohort_tests::batcher::binary())
        .arg(&stripped)
        .status()
        .expect("objcopy (binutils) runs");
    assert!(status.success(), "objcopy --strip-debug failed");
    stripped
}

#[test]
fn the_image_runs_the_shipped_configuration_as_non_root_and_answers() {
    let dir = std::env::temp_dir().join(format!("cohort-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    let image = build_image(&binary_to_pack(&dir), &layout);

    // The image config: a non-root user, `cohort serve`, reading the mounted file.
    let user = image["User"].as_str().expect("a User");
    let (uid, gid) = user.split_once(':').expect("uid:gid");
    let uid: u32 = uid.parse().expect("a numeric uid");
    assert!(uid != 0 && gid != "0", "non-root: {user}");
    let entrypoint = strings(&image["Entrypoint"]);
    assert_eq!(entrypoint.len(), 2, "{entrypoint:?}");
    assert!(entrypoint[0].ends_with("/cohort"), "{entrypoint:?}");
    assert_eq!(entrypoint[1], "serve");
    assert_eq!(
        strings(&image["Cmd"]),
        ["--config", "/etc/cohort/cohort.toml"]
    );

    unpack(&layout, &rootfs);
    // umoci makes the unpacked tree's top directory private; the image's own files keep
    // the modes the layer gives them. The bundle around it must be open to the image's user.
    for path in [&dir, &rootfs] {
        let status = Command::new("chmod").arg("755").arg(path).status().unwrap();
        assert!(status.success());
    }

    for overlay in ["assign", "batch", "gpu"] {
        let objects = render(overlay);
        let batcher = find(&objects, "StatefulSet", "cohort-batcher");
        let pod = &batcher["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        // The manifests run the image's user (runAsNonRoot would refuse uid 0 anyway).
        assert_eq!(pod["securityContext"]["runAsUser"], uid, "{overlay}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{overlay}");

        let (path, shipped) = batcher_config(&objects);
        let toml: toml::Table = shipped.parse().unwrap();
        // A configuration that discovers its replicas gets them from a real DNS server
        // serving the shipped Service name: three engine pods answering probes.
        let discovery = toml.get("discovery").map(|d| {
            let service = d["dns"].as_str().expect("discovery.dns").to_owned();
            let port_name = d["port_name"].as_str().unwrap_or("http").to_owned();
            let (pods, engines, port) =
                engine_pods(&["llm-engine-0", "llm-engine-1", "llm-engine-2"]);
            let dns = Dnsmasq::start(&service, &port_name, port, &pods);
            (pods, engines, port, dns)
        });
        let resolver = discovery.as_ref().map(|(_, _, _, dns)| dns.address());
        let (mount, file) = path.rsplit_once('/').unwrap();
        let config_dir = dir.join(format!("config-{overlay}"));
        std::fs::create_dir_all(&config_dir).unwrap();

        let mut env: Vec<(String, String)> = strings(&image["Env"])
            .iter()
            .map(|e| {
                let (name, value) = e.split_once('=').unwrap();
                (name.to_owned(), value.to_owned())
            })
            .collect();
        for variable in container["env"].as_array().into_iter().flatten() {
            let name = variable["name"].as_str().unwrap().to_owned();
            env.retain(|(n, _)| *n != name);
            env.push((name, variable["value"].as_str().unwrap().to_owned()));
        }
        // Kubernetes sets HOSTNAME to the pod's name; the shard index is its ordinal.
        env.push(("HOSTNAME".into(), "cohort-batcher-1".into()));
        let argv = kubernetes_argv(&image, container);

        let what = format!("{overlay}: cohort serve in the image");
        let (sandbox, grpc) = with_port_retries(&what, |_| {
            let (adapted, grpc, http) = adapt(&shipped, resolver.as_deref());
            std::fs::write(config_dir.join(file), adapted).unwrap();
            for path in [&config_dir, &config_dir.join(file)] {
                let mode = if path.is_dir() { "755" } else { "644" };
                let chmod = Command::new("chmod").arg(mode).arg(path).status();
                assert!(chmod.unwrap().success());
            }
            let mut sandbox = Run {
                rootfs: &rootfs,
                user,
                argv: &argv,
                env: env.clone(),
                workdir: image["WorkingDir"].as_str().unwrap_or("/"),
                config_dir: &config_dir,
                mount,
            }
            .start(dir.join(format!("{overlay}.log")));
            let mut exited = false;
            let ready = eventually(Duration::from_secs(20), || {
                exited = sandbox.child.try_wait().unwrap().is_some();
                exited
                    || client::request(http, "GET", "/readyz", &[], b"")
                        .is_ok_and(|r| r.status == 200)
            });
            let log = sandbox.log();
            match (ready, exited) {
                (true, false) => Ok((sandbox, grpc)),
                (_, true) if port_was_taken(&log) => Err(log),
                _ => panic!("{overlay}: /readyz not 200 in 20 s:\n{log}"),
            }
        });
        let reply = match &discovery {
            // A discovered replica is chosen from its first good probe: until then the
            // batcher answers UNAVAILABLE (and the filter routes by key).
            Some((pods, _, port, _)) => {
                let mut reply = None;
                let answered = eventually(Duration::from_secs(15), || {
                    reply = try_assign(grpc).ok();
                    reply.is_some()
                });
                assert!(
                    answered,
                    "{overlay}: no Assign answer with discovered replicas:\n{}",
                    sandbox.log()
                );
                let reply = reply.unwrap();
                let pod = pods
                    .iter()
                    .find(|p| p.name == reply.shard)
                    .unwrap_or_else(|| {
                        panic!("{overlay}: assigned {:?}, not a pod in DNS", reply.shard)
                    });
                assert_eq!(reply.endpoint, format!("{}:{port}", pod.ip), "{overlay}");
                reply
            }
            None => {
                let reply = try_assign(grpc).unwrap_or_else(|e| panic!("{overlay}: {e}"));
                let names: Vec<&str> = toml["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["name"].as_str().unwrap())
                    .collect();
                assert!(
                    names.contains(&reply.shard.as_str()),
                    "{overlay}: assigned {:?}, not one of {names:?}",
                    reply.shard
                );
                reply
            }
        };
        let log = sandbox.log();
        assert!(log.contains("shard=1 shards=2"), "{overlay}: {log}");
        if overlay == "gpu" {
            // --store gpu took effect: this binary (no `cuda` feature, or no GPU here) says
            // why it falls back, or names the GPU it opened.
            assert!(
                log.contains("store gpu unavailable") || log.contains("fingerprint store on"),
                "{log}"
            );
        }
        eprintln!("{overlay}: the image answered /readyz and Assign ({reply:?})");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_misspelt_key_in_the_shipped_cohort_toml_stops_the_batcher_at_start() {
    // A planted error in the file the ConfigMap carries survives rendering verbatim, and
    // `cohort serve` refuses it by name rather than run on a default.
    let (_, shipped) = batcher_config(&render("assign"));
    let planted = shipped.replacen("shard_count = 2", "shard_cuont = 2", 1);
    assert_ne!(planted, shipped, "the shipped file sets shard_count = 2");
    let path = std::env::temp_dir().join(format!("cohort-planted-{}.toml", std::process::id()));
    std::fs::write(&path, planted).unwrap();
    let mut child = Command::new(cohort_tests::batcher::binary())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env_remove("COHORT_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = eventually(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(exited, "cohort serve ran on a misspelt configuration");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("shard_cuont"), "{stderr}");
}

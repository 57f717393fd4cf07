//! The root context: reads the plugin configuration and defines the stats, once per VM,
//! and hands both to every HTTP context.
//!
//! Envoy runs one VM per worker thread (and one on the main thread); each has its own
//! root context, so this runs on each. Defining a metric that exists returns its id.

use crate::config::FilterConfig;
use crate::http::CohortHttp;
use crate::stats::Stats;
use log::{error, info, warn};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

/// What every HTTP context of this VM shares.
pub struct Shared {
    /// The configuration, or why it was refused (then everything passes through).
    pub config: Result<FilterConfig, String>,
    /// `None` only if the host refused to define metrics; requests still flow.
    pub stats: Option<Stats>,
}

pub struct CohortRoot {
    shared: Rc<Shared>,
}

impl Default for CohortRoot {
    fn default() -> Self {
        CohortRoot {
            shared: Rc::new(Shared {
                config: Err("not configured yet".into()),
                stats: None,
            }),
        }
    }
}

impl Context for CohortRoot {}

impl RootContext for CohortRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match FilterConfig::parse(&bytes) {
            Ok(config) => {
                if config.mode != crate::config::Mode::Affinity {
                    warn!(
                        "cohort: mode {} needs the batcher integration, which this build does not have; routing in affinity mode",
                        config.mode.as_str()
                    );
                }
                info!("cohort: configured, mode {}", config.mode.as_str());
                Ok(config)
            }
            Err(e) => {
                error!("cohort: invalid configuration, passing all traffic through: {e}");
                Err(e.to_string())
            }
        };
        let stats = match Stats::define() {
            Ok(stats) => Some(stats),
            Err(status) => {
                error!("cohort: could not define stats ({status:?}); running without them");
                None
            }
        };
        self.shared = Rc::new(Shared { config, stats });
        // Returning true even for an invalid configuration keeps the listener serving.
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(CohortHttp::new(Rc::clone(&self.shared))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

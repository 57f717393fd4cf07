//! `cohort serve`: run the batcher (see `crate::serve` for what it does).

use crate::config::{ServeArgs, ServeConfig};
use anyhow::Context as _;

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let hostname = std::env::var("HOSTNAME").ok();
    let config = ServeConfig::load(&args, hostname.as_deref())
        .context("invalid cohort serve configuration")?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?
        .block_on(crate::serve::run(config))
}

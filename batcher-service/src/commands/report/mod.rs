//! `cohort report`: is Cohort helping this traffic, now? Reads the filter's per-group
//! response stats from Prometheus (TTFB histograms, responses by status class, prompt and
//! cached tokens; docs/METRICS.md) and prints, for Cohort's group against the hold-out,
//! request counts, TTFT p50 and p95, cached-token share and 5xx rate, each difference with
//! a 95% confidence interval and a verdict (docs/OPERATIONS.md, "`cohort report`").
//!
//! - [`estimate`]: the statistics (pure): histogram quantiles, per-unit replicates, Welch's
//!   t, the "too small" threshold (on responses, and for TTFT on the histogram's samples);
//! - [`prometheus`]: the PromQL and a plain-HTTP client for `/api/v1/query`;
//! - [`render`]: the table (or JSON) with the method and the shared-replicas caveat.

pub mod estimate;
pub mod prometheus;
pub mod render;

use super::inputs::Format;
use anyhow::{anyhow, Context, Result};
use estimate::Threshold;
use prometheus::{Client, Queries, Scope};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct Args {
    /// The Prometheus server that scrapes the proxies (plain HTTP), e.g. http://127.0.0.1:9090.
    #[arg(long)]
    prometheus: String,
    /// The window to compare over, up to now: a whole number and s, m, h or d.
    #[arg(long, default_value = "1h")]
    since: String,
    /// Only this Envoy route (its name as in `cohort_route`; other characters than
    /// letters, digits, `_` and `-` are read as `_`, as the filter writes them).
    #[arg(long)]
    route: Option<String>,
    /// Extra PromQL label matchers for every series, e.g. 'namespace="llm",job="envoy"'.
    #[arg(long)]
    selector: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub fn run(args: Args) -> Result<()> {
    let since_s = prometheus::parse_duration(&args.since).map_err(|e| anyhow!("--since {e}"))?;
    let base = prometheus::base_url(&args.prometheus).map_err(anyhow::Error::msg)?;
    if let Some(selector) = &args.selector {
        if selector.contains(['{', '}']) {
            anyhow::bail!("--selector {selector:?}: give the matchers without braces, e.g. 'namespace=\"llm\"'");
        }
    }
    let scope = Scope {
        since_s,
        route: args.route.as_deref().map(prometheus::route_label),
        selector: args.selector.clone(),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs_f64();
    let client = Client::new(base.clone(), now);
    let queries = scope.queries();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let answers = runtime.block_on(async {
        anyhow::Ok(Queries {
            responses: client.query(&queries.responses).await?,
            ttfb: client.query(&queries.ttfb).await?,
            prompt: client.query(&queries.prompt).await?,
            cached: client.query(&queries.cached).await?,
            bypassed: client.query(&queries.bypassed).await?,
        })
    })?;
    let (cohort, holdout) = prometheus::assemble(&answers);
    let bypassed = prometheus::bypassed(&answers.bypassed);
    let threshold = Threshold::default();
    let comparison = estimate::compare(&cohort, &holdout, &threshold);
    let header = render::Header {
        prometheus: base,
        since: args.since,
        route: scope.route,
        selector: scope.selector,
    };
    match args.format {
        Format::Table => print!(
            "{}",
            render::text(&header, &comparison, &bypassed, &threshold)
        ),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&render::json(
                &header,
                &comparison,
                &bypassed,
                &threshold
            ))?
        ),
    }
    Ok(())
}

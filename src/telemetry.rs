//! Logging and Prometheus metrics (`GET /metrics`, docs/design.md §5); the per-tenant series in
//! [`tenants`].

pub mod tenants;

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::queue::gauges::StoredGauges;

/// Log format of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global `tracing` subscriber. Level from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,sqlx=warn,tower_http=warn,kube_client=warn,kube_runtime=info")
    });
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `succeeded`, `failed`, `cancelled` or `retry_scheduled`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The matched route template, e.g. `/api/v1/work-orders/{id}`, never the raw path.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HealthLabel {
    /// `never_seen`, `active` or `stale` (docs/design.md §5); retired agents are not counted.
    pub health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the orders wait (docs/design.md §10): `no_matching_agent`, `no_agent_connected`,
    /// `agents_busy`, `backing_off` or `queued`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabel {
    /// Why output bytes were not kept (docs/design.md §9): `cap` (the per-order cap dropped older
    /// output) or `gap` (the agent reported bytes it could not deliver).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// `workorder` or `executor`.
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerErrorLabels {
    /// `workorder` or `executor`.
    pub controller: String,
    /// One of [`RECONCILE_ERRORS`].
    pub error: String,
}

/// The controllers, as the `controller` label of `pullman_controller_*` names them.
pub const CONTROLLERS: [&str; 2] = ["workorder", "executor"];

/// The kinds of a failed reconcile, as the `error` label names them: every value
/// `controller::Error::metric_label` returns (a test there holds it to this list), so the error
/// counters exist at zero before the first error.
pub const RECONCILE_ERRORS: [&str; 4] = ["kube", "queue", "finalizer", "invalid"];

/// The controller's metrics: reconciles, their errors by kind, and their durations.
///
/// Process-wide (see [`controller_metrics`]) rather than carried in the controller's `Context`:
/// the controller may run in a process without the HTTP server, and every `Metrics` registry of
/// the process exports these same series.
#[derive(Clone)]
pub struct ControllerMetrics {
    /// `pullman_controller_reconciles_total{controller}`: reconciles run, whatever their result.
    pub reconciles: Family<ControllerLabel, Counter>,
    /// `pullman_controller_reconcile_errors_total{controller,error}`: reconciles that failed.
    pub errors: Family<ControllerErrorLabels, Counter>,
    /// `pullman_controller_reconcile_duration_seconds{controller}`: time of one reconcile.
    pub duration: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    /// `pullman_controller_events_dropped_total`: Kubernetes Events not recorded because the
    /// controller's Event queue was full (a burst of transitions; see `controller::events`).
    pub events_dropped: Counter,
}

impl ControllerMetrics {
    fn new() -> Self {
        let m = ControllerMetrics {
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.001, 2.0, 16))) as fn() -> Histogram,
            ),
            events_dropped: Counter::default(),
        };
        // Exported from the start, so rates and alerts work before the first reconcile.
        for controller in CONTROLLERS {
            let label = ControllerLabel {
                controller: controller.into(),
            };
            let _ = m.reconciles.get_or_create(&label);
            let _ = m.duration.get_or_create(&label);
            for error in RECONCILE_ERRORS {
                let _ = m.errors.get_or_create(&ControllerErrorLabels {
                    controller: controller.into(),
                    error: error.into(),
                });
            }
        }
        m
    }

    /// Records one reconcile of `controller` that took `elapsed`, and its error label if it
    /// failed.
    pub fn observe(&self, controller: &str, elapsed: Duration, error: Option<&str>) {
        let label = ControllerLabel {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&label).inc();
        self.duration
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
        if let Some(error) = error {
            self.errors
                .get_or_create(&ControllerErrorLabels {
                    controller: controller.to_string(),
                    error: error.to_string(),
                })
                .inc();
        }
    }
}

static CONTROLLER_METRICS: LazyLock<ControllerMetrics> = LazyLock::new(ControllerMetrics::new);

/// The process's controller metrics (recorded by `controller::measured`).
pub fn controller_metrics() -> &'static ControllerMetrics {
    &CONTROLLER_METRICS
}

/// The server's metrics. Counters are updated where things happen; the database gauges are set at
/// scrape time, the costly ones from the figures one replica stores (`queue::gauges`).
pub struct Metrics {
    registry: Registry,
    /// `pullman_work_orders{status}`: active orders by state, as last computed off the scrape
    /// path (`queue::gauges`).
    pub work_orders: Family<StatusLabel, Gauge>,
    /// `pullman_claims_total`: successful claims.
    pub claims: Counter,
    /// `pullman_completions_total{outcome}`.
    pub completions: Family<OutcomeLabel, Counter>,
    /// `pullman_reaped_claims_total`: claims released by the reaper.
    pub reaped_claims: Counter,
    /// `pullman_reclaims_exhausted_total`: orders failed because reclaims ran out.
    pub reclaims_exhausted: Counter,
    /// `pullman_retries_promoted_total`.
    pub retries_promoted: Counter,
    /// `pullman_claim_duration_seconds`: time to answer a claim request that got an order,
    /// long-poll wait included.
    pub claim_duration: Histogram,
    /// `pullman_queue_wait_seconds`: from creation to claim.
    pub queue_wait: Histogram,
    /// `pullman_queue_lag_seconds`: age of the oldest claimable order (0 when none), refreshed
    /// from the database at scrape time (`Queue::oldest_claimable_age`).
    pub queue_lag: Gauge<f64, AtomicU64>,
    /// `pullman_agents{health}`: live agents by health, refreshed at scrape time.
    pub agents: Family<HealthLabel, Gauge>,
    /// `pullman_work_orders_waiting{reason}`: unclaimed orders by why they wait (docs/design.md §10),
    /// as last computed off the scrape path (`queue::gauges`).
    pub waiting: Family<ReasonLabel, Gauge>,
    /// `pullman_work_orders_waiting_oldest_seconds{reason}`: the longest wait of each reason's
    /// orders, since each last became unclaimed (0 when none).
    pub waiting_oldest: Family<ReasonLabel, Gauge<f64, AtomicU64>>,
    /// `pullman_work_orders_waiting_unclassified`: unclaimed orders whose reason was not decided,
    /// in the groups past `queue::gauges::MAX_WAITING_GROUPS` (0 unless targeting is that varied).
    pub waiting_unclassified: Gauge,
    /// `pullman_database_gauges_age_seconds`: how old the figures of `pullman_work_orders`, the
    /// waiting gauges and the tenant gauges are, in seconds, at each scrape (so it grows while
    /// the database cannot be read); -1 until this process has read them once.
    pub database_gauges_age: Gauge<f64, AtomicU64>,
    /// When the figures last read were computed, by this process's clock.
    figures_as_of: std::sync::Mutex<Option<std::time::Instant>>,
    /// `pullman_long_polls`: claim-next requests waiting now.
    pub long_polls: Gauge<i64, AtomicI64>,
    /// `pullman_output_bytes_received_total`: bytes of output line text stored (docs/design.md §9;
    /// resent chunks not counted again).
    pub output_bytes: Counter,
    /// `pullman_output_lines_received_total`: output lines stored.
    pub output_lines: Counter,
    /// `pullman_output_dropped_bytes_total{reason}`: output bytes not kept, `cap` or `gap`.
    pub output_dropped: Family<DropLabel, Counter>,
    /// `pullman_output_followers`: `follow=true` readers connected now.
    pub output_followers: Gauge<i64, AtomicI64>,
    /// `pullman_http_requests_total{method,route,status}`.
    pub http_requests: Family<HttpLabels, Counter>,
    /// `pullman_http_request_duration_seconds{route}`.
    pub http_duration: Family<RouteLabel, Histogram, fn() -> Histogram>,
    /// `pullman_tenant_*` and `pullman_other_tenants_*` (issue #40).
    pub tenants: tenants::TenantMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric under the `pullman_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pullman");
        let work_orders = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "work_orders",
            "Active work orders by state",
            work_orders.clone(),
        );
        let claims = Counter::default();
        registry.register("claims", "Work orders claimed", claims.clone());
        let completions = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "completions",
            "Completions reported by agents, by outcome",
            completions.clone(),
        );
        // Every outcome is exported from the start, so rates work before the first completion.
        for outcome in ["succeeded", "failed", "cancelled", "retry_scheduled"] {
            let _ = completions.get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            });
        }
        let reaped_claims = Counter::default();
        registry.register(
            "reaped_claims",
            "Stale or expired claims released by the reaper",
            reaped_claims.clone(),
        );
        let reclaims_exhausted = Counter::default();
        registry.register(
            "reclaims_exhausted",
            "Work orders failed because max_reclaims ran out",
            reclaims_exhausted.clone(),
        );
        let retries_promoted = Counter::default();
        registry.register(
            "retries_promoted",
            "RETRY_PENDING orders made PENDING when due",
            retries_promoted.clone(),
        );
        let claim_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        registry.register(
            "claim_duration_seconds",
            "Time to answer a claim that returned an order",
            claim_duration.clone(),
        );
        let queue_wait = Histogram::new(exponential_buckets(0.001, 4.0, 14));
        registry.register(
            "queue_wait_seconds",
            "Time from creation to claim",
            queue_wait.clone(),
        );
        let queue_lag = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "queue_lag_seconds",
            "Age of the oldest claimable work order (0 when none)",
            queue_lag.clone(),
        );
        let agents = Family::<HealthLabel, Gauge>::default();
        registry.register("agents", "Live agents by health", agents.clone());
        let waiting = Family::<ReasonLabel, Gauge>::default();
        registry.register(
            "work_orders_waiting",
            "Unclaimed work orders by why they wait",
            waiting.clone(),
        );
        let waiting_oldest = Family::<ReasonLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "work_orders_waiting_oldest_seconds",
            "Longest wait of the unclaimed work orders of each reason (0 when none)",
            waiting_oldest.clone(),
        );
        let waiting_unclassified = Gauge::default();
        registry.register(
            "work_orders_waiting_unclassified",
            "Unclaimed work orders in targeting groups past the most whose reason is decided",
            waiting_unclassified.clone(),
        );
        let database_gauges_age = Gauge::<f64, AtomicU64>::default();
        database_gauges_age.set(-1.0);
        registry.register(
            "database_gauges_age_seconds",
            "Age of the work order, waiting and tenant gauges' figures (-1 before the first)",
            database_gauges_age.clone(),
        );
        // Every reason is exported from the start, so alerts can name one before it happens.
        for reason in crate::queue::WaitReason::ALL {
            let label = ReasonLabel {
                reason: reason.as_str().to_string(),
            };
            let _ = waiting.get_or_create(&label);
            let _ = waiting_oldest.get_or_create(&label);
        }
        let controller = controller_metrics();
        registry.register(
            "controller_reconciles",
            "WorkOrder and Executor reconciles run",
            controller.reconciles.clone(),
        );
        registry.register(
            "controller_reconcile_errors",
            "Reconciles that failed, by error kind",
            controller.errors.clone(),
        );
        registry.register(
            "controller_reconcile_duration_seconds",
            "Time of one reconcile",
            controller.duration.clone(),
        );
        registry.register(
            "controller_events_dropped",
            "Kubernetes Events not recorded because the controller's Event queue was full",
            controller.events_dropped.clone(),
        );
        let long_polls = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "long_polls",
            "Claim-next requests waiting for an order",
            long_polls.clone(),
        );
        let output_bytes = Counter::default();
        registry.register(
            "output_bytes_received",
            "Bytes of work-order output stored",
            output_bytes.clone(),
        );
        let output_lines = Counter::default();
        registry.register(
            "output_lines_received",
            "Lines of work-order output stored",
            output_lines.clone(),
        );
        let output_dropped = Family::<DropLabel, Counter>::default();
        registry.register(
            "output_dropped_bytes",
            "Bytes of work-order output not kept: cap (older output past the per-order cap) or gap (lost by the agent)",
            output_dropped.clone(),
        );
        for reason in ["cap", "gap"] {
            let _ = output_dropped.get_or_create(&DropLabel {
                reason: reason.into(),
            });
        }
        let output_followers = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "output_followers",
            "Readers following work-order output now",
            output_followers.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by method, route and status",
            http_requests.clone(),
        );
        let http_duration =
            Family::<RouteLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.0005, 2.0, 18))) as fn() -> Histogram,
            );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            http_duration.clone(),
        );
        let tenants = tenants::TenantMetrics::register(&mut registry);
        Metrics {
            registry,
            work_orders,
            claims,
            completions,
            reaped_claims,
            reclaims_exhausted,
            retries_promoted,
            claim_duration,
            queue_wait,
            queue_lag,
            agents,
            waiting,
            waiting_oldest,
            waiting_unclassified,
            database_gauges_age,
            figures_as_of: Default::default(),
            long_polls,
            output_bytes,
            output_lines,
            output_dropped,
            output_followers,
            http_requests,
            http_duration,
            tenants,
        }
    }

    /// Sets the gauges computed off the scrape path (`queue::gauges`) from their stored figures.
    pub fn set_database_figures(&self, stored: &StoredGauges) {
        let figures = &stored.figures;
        for status in ["PENDING", "CLAIMED", "RETRY_PENDING"] {
            let n = figures.statuses.get(status).copied().unwrap_or(0);
            self.work_orders
                .get_or_create(&StatusLabel {
                    status: status.to_string(),
                })
                .set(n);
        }
        for (reason, c) in &figures.waiting {
            let label = ReasonLabel {
                reason: reason.clone(),
            };
            self.waiting.get_or_create(&label).set(c.orders);
            self.waiting_oldest
                .get_or_create(&label)
                .set(c.oldest_seconds.max(0.0));
        }
        self.waiting_unclassified.set(figures.unclassified);
        self.tenants.set_counts(&figures.tenants);
        let age = Duration::try_from_secs_f64(stored.age_seconds).unwrap_or_default();
        let as_of = std::time::Instant::now().checked_sub(age);
        *self.figures_as_of.lock().unwrap() = as_of.or(Some(std::time::Instant::now()));
    }

    /// Counts one completion by outcome label.
    pub fn count_completion(&self, outcome: &str) {
        self.completions
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Counts output bytes not kept for `reason` (`cap` or `gap`).
    pub fn count_output_dropped(&self, reason: &str, bytes: i64) {
        if bytes > 0 {
            self.output_dropped
                .get_or_create(&DropLabel {
                    reason: reason.to_string(),
                })
                .inc_by(bytes as u64);
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if let Some(as_of) = *self.figures_as_of.lock().unwrap() {
            self.database_gauges_age.set(as_of.elapsed().as_secs_f64());
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::gauges::GaugeFigures;

    fn age(m: &Metrics) -> f64 {
        let text = m.encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("pullman_database_gauges_age_seconds "))
            .unwrap_or_else(|| panic!("no age in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn the_gauges_age_is_minus_one_before_the_first_figures_then_grows_at_each_scrape() {
        let m = Metrics::new();
        assert_eq!(age(&m), -1.0);
        m.set_database_figures(&StoredGauges {
            figures: GaugeFigures::default(),
            age_seconds: 5.0,
        });
        let first = age(&m);
        assert!((5.0..6.0).contains(&first), "{first}");
        // No new figures (the database cannot be read): the next scrape says they are older.
        std::thread::sleep(Duration::from_millis(200));
        let later = age(&m);
        assert!(later >= first + 0.2, "{first} then {later}");
    }
}

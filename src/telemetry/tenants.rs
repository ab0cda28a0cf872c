//! Metrics per tenant (issue #40, docs/design.md §3): how many orders each tenant has waiting
//! and claimed, and how long its orders waited to be claimed. Tenant names are users' strings,
//! so the label set is bounded: the [`TOP_TENANTS`] tenants with the most active orders get
//! their own series, every other tenant is summed into `pullman_other_tenants_*`; the orders
//! without a tenant are `tenant=""` (which Prometheus reads as no `tenant` label).

use std::collections::HashSet;
use std::sync::{Mutex, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::queue::backlog::TenantCount;

/// How many tenants get their own series, at most (the busiest by active orders, as last
/// computed off the scrape path: `queue::gauges`). The wait histograms keep a series once made (a histogram is cumulative), up to
/// twice this many.
pub const TOP_TENANTS: i64 = 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantStateLabels {
    /// The tenant; empty for the orders without one.
    pub tenant: String,
    /// `waiting` (PENDING or RETRY_PENDING) or `claimed`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `waiting` or `claimed`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant; empty for the orders without one.
    pub tenant: String,
}

fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 14))
}

/// The per-tenant series of the server's `Metrics`.
pub struct TenantMetrics {
    /// `pullman_tenant_work_orders{tenant,state}`: the busiest tenants' active orders.
    orders: Family<TenantStateLabels, Gauge>,
    /// `pullman_other_tenants_work_orders{state}`: every other tenant's, summed.
    other_orders: Family<StateLabel, Gauge>,
    /// `pullman_tenant_queue_wait_seconds{tenant}`: creation to claim, this replica's claims of
    /// the busiest tenants' orders.
    wait: Family<TenantLabel, Histogram, fn() -> Histogram>,
    /// `pullman_other_tenants_queue_wait_seconds`: the same for every other tenant.
    other_wait: Histogram,
    /// The tenants that have their own series now (`None`: no tenant).
    top: RwLock<HashSet<Option<String>>>,
    /// The tenants that have a wait series (never removed), at most 2 × [`TOP_TENANTS`].
    wait_series: Mutex<HashSet<Option<String>>>,
}

impl TenantMetrics {
    /// Registers the series in `registry` (under its `pullman` prefix).
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = TenantMetrics {
            orders: Family::default(),
            other_orders: Family::default(),
            wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            other_wait: wait_histogram(),
            top: RwLock::default(),
            wait_series: Mutex::default(),
        };
        registry.register(
            "tenant_work_orders",
            "Active work orders of the busiest tenants, waiting or claimed",
            m.orders.clone(),
        );
        registry.register(
            "other_tenants_work_orders",
            "Active work orders of every tenant not in pullman_tenant_work_orders, waiting or claimed",
            m.other_orders.clone(),
        );
        registry.register(
            "tenant_queue_wait_seconds",
            "Time from creation to claim of the busiest tenants' orders",
            m.wait.clone(),
        );
        registry.register(
            "other_tenants_queue_wait_seconds",
            "Time from creation to claim of the other tenants' orders",
            m.other_wait.clone(),
        );
        // Exported from the start, at 0, like the other gauges.
        for state in ["waiting", "claimed"] {
            let _ = m.other_orders.get_or_create(&StateLabel {
                state: state.into(),
            });
        }
        m
    }

    /// Replaces the gauges with `counts` (`Queue::compute_gauges` with [`TOP_TENANTS`]): a tenant
    /// no longer among the busiest loses its series.
    pub fn set_counts(&self, counts: &[TenantCount]) {
        let mut top = HashSet::new();
        let (mut other_waiting, mut other_claimed) = (0, 0);
        for c in counts {
            if !c.top {
                other_waiting += c.waiting;
                other_claimed += c.claimed;
                continue;
            }
            let tenant = c.tenant.clone().unwrap_or_default();
            for (state, n) in [("waiting", c.waiting), ("claimed", c.claimed)] {
                self.orders
                    .get_or_create(&TenantStateLabels {
                        tenant: tenant.clone(),
                        state: state.into(),
                    })
                    .set(n);
            }
            top.insert(c.tenant.clone());
        }
        for (state, n) in [("waiting", other_waiting), ("claimed", other_claimed)] {
            self.other_orders
                .get_or_create(&StateLabel {
                    state: state.into(),
                })
                .set(n);
        }
        // Only the tenants that left lose their series: a scrape encoding meanwhile never sees
        // the family empty.
        let mut current = self.top.write().expect("tenant metrics lock");
        for gone in current.difference(&top) {
            for state in ["waiting", "claimed"] {
                self.orders.remove(&TenantStateLabels {
                    tenant: gone.clone().unwrap_or_default(),
                    state: state.into(),
                });
            }
        }
        *current = top;
    }

    /// Records that an order of `tenant` waited `seconds` from creation to claim: in its own
    /// series when the tenant is among the busiest at the last refresh (and the bound allows),
    /// else in the others'.
    pub fn observe_wait(&self, tenant: Option<&str>, seconds: f64) {
        let key = tenant.map(str::to_string);
        let own = self.top.read().expect("tenant metrics lock").contains(&key) && {
            let mut series = self.wait_series.lock().expect("tenant metrics lock");
            series.contains(&key)
                || (series.len() < 2 * TOP_TENANTS as usize && series.insert(key.clone()))
        };
        if own {
            self.wait
                .get_or_create(&TenantLabel {
                    tenant: key.unwrap_or_default(),
                })
                .observe(seconds);
        } else {
            self.other_wait.observe(seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(tenant: Option<&str>, top: bool, waiting: i64, claimed: i64) -> TenantCount {
        TenantCount {
            tenant: tenant.map(str::to_string),
            top,
            waiting,
            claimed,
        }
    }

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn the_busiest_tenants_get_series_and_the_rest_are_summed() {
        let mut registry = Registry::with_prefix("pullman");
        let m = TenantMetrics::register(&mut registry);
        m.set_counts(&[
            count(Some("big"), true, 7, 2),
            count(None, true, 3, 0),
            count(None, false, 5, 1),
        ]);
        m.observe_wait(Some("big"), 0.5);
        m.observe_wait(Some("small"), 0.5);
        let text = encoded(&registry);
        for line in [
            r#"pullman_tenant_work_orders{tenant="big",state="waiting"} 7"#,
            r#"pullman_tenant_work_orders{tenant="big",state="claimed"} 2"#,
            r#"pullman_tenant_work_orders{tenant="",state="waiting"} 3"#,
            r#"pullman_other_tenants_work_orders{state="waiting"} 5"#,
            r#"pullman_other_tenants_work_orders{state="claimed"} 1"#,
            r#"pullman_tenant_queue_wait_seconds_count{tenant="big"} 1"#,
            "pullman_other_tenants_queue_wait_seconds_count 1",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        // `big` drops out of the busiest: its gauges go, its wait series stays (cumulative).
        m.set_counts(&[count(Some("new"), true, 1, 0)]);
        let text = encoded(&registry);
        assert!(
            !text.contains(r#"pullman_tenant_work_orders{tenant="big""#),
            "{text}"
        );
        assert!(text.contains(r#"pullman_tenant_work_orders{tenant="new",state="waiting"} 1"#));
        assert!(text.contains(r#"pullman_tenant_queue_wait_seconds_count{tenant="big"} 1"#));
        m.observe_wait(Some("big"), 0.5);
        assert!(encoded(&registry).contains("pullman_other_tenants_queue_wait_seconds_count 2"));
    }

    #[test]
    fn wait_series_stay_bounded() {
        let mut registry = Registry::with_prefix("pullman");
        let m = TenantMetrics::register(&mut registry);
        for round in 0..5 {
            let names: Vec<String> = (0..TOP_TENANTS).map(|i| format!("r{round}-t{i}")).collect();
            let counts: Vec<TenantCount> =
                names.iter().map(|n| count(Some(n), true, 1, 0)).collect();
            m.set_counts(&counts);
            for n in &names {
                m.observe_wait(Some(n), 0.1);
            }
        }
        let text = encoded(&registry);
        let series = text
            .lines()
            .filter(|l| l.starts_with("pullman_tenant_queue_wait_seconds_count{"))
            .count();
        assert_eq!(series, 2 * TOP_TENANTS as usize, "{text}");
        let others = 5 * TOP_TENANTS - 2 * TOP_TENANTS;
        assert!(
            text.contains(&format!(
                "pullman_other_tenants_queue_wait_seconds_count {others}"
            )),
            "{text}"
        );
    }
}

//! The queue's rules as pure functions (docs/design.md §2–§5), kept apart from SQL so they can be tested
//! directly and reused by the executor: retries, the watch budget, agent health. Eligibility and
//! claim liveness, which the SQL statements include, live in `queue::eligibility`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::model::{AgentHealth, RetryOnDisruption};

/// Longest backoff before a retry, in seconds: 24 h (docs/design.md §2).
pub const MAX_BACKOFF_SECONDS: u64 = 86_400;

/// What happens to an order after its k-th failed attempt (docs/design.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureDecision {
    /// Becomes `RETRY_PENDING` with `retry_count = retry_count`, claimable after `delay_seconds`.
    Retry {
        retry_count: i32,
        delay_seconds: u64,
    },
    /// Goes to the log as failed.
    Fail,
}

/// Backoff before retry `k` (1-based): `backoff_seconds × 2^(k−1)`, capped at 24 h, saturating so
/// that no input overflows (`k = 100`, `backoff = 86400` gives 86400).
pub fn retry_delay_seconds(backoff_seconds: u32, k: u32) -> u64 {
    let exponent = k.saturating_sub(1);
    let factor = if exponent >= 63 {
        u64::MAX
    } else {
        1u64 << exponent
    };
    u64::from(backoff_seconds)
        .saturating_mul(factor)
        .min(MAX_BACKOFF_SECONDS)
}

/// Decides the fate of a failed attempt (docs/design.md §2): the k-th failure (k = `retry_count` + 1)
/// retries when it is retryable and k ≤ `max_retries`; otherwise the order fails.
pub fn decide_failure(
    retry_count: i32,
    max_retries: i32,
    backoff_seconds: i32,
    retryable: bool,
) -> FailureDecision {
    let k = retry_count.saturating_add(1);
    if retryable && k <= max_retries {
        FailureDecision::Retry {
            retry_count: k,
            delay_seconds: retry_delay_seconds(
                u32::try_from(backoff_seconds).unwrap_or(1),
                u32::try_from(k).unwrap_or(1),
            ),
        }
    } else {
        FailureDecision::Fail
    }
}

/// What happens to an order after an attempt ended by a disruption (docs/design.md §12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisruptionDecision {
    /// Runs again at once: `RETRY_PENDING` due now, `reclaim_count + 1`, `retry_count` unchanged.
    RunAgain,
    /// Goes to the log as failed. `why_not` (policy `safe` only) is appended to the agent's
    /// message: why the order was not run again.
    Fail { why_not: Option<String> },
}

/// Decides the fate of an attempt ended by a disruption (docs/design.md §12). It runs again only
/// when the order's policy is `safe`, the agent knows the disrupted run stopped (`stopped`: the
/// complete's `retryable`), so runs never overlap, and a reclaim is left
/// (`reclaim_count < max_reclaims`, the limit the reaper's releases count against too).
/// Retries (`max_retries`) are not used: a disruption is not the work's failure.
pub fn decide_disruption(
    policy: RetryOnDisruption,
    stopped: bool,
    reclaim_count: i32,
    max_reclaims: i32,
) -> DisruptionDecision {
    let why_not = match policy {
        RetryOnDisruption::Never => return DisruptionDecision::Fail { why_not: None },
        RetryOnDisruption::Safe if !stopped => {
            "; not run again: the disrupted run may still be running".to_string()
        }
        RetryOnDisruption::Safe if reclaim_count >= max_reclaims => {
            let noun = if reclaim_count == 1 {
                "reclaim"
            } else {
                "reclaims"
            };
            format!("; not run again: {reclaim_count} {noun} used (max_reclaims {max_reclaims})")
        }
        RetryOnDisruption::Safe => return DisruptionDecision::RunAgain,
    };
    DisruptionDecision::Fail {
        why_not: Some(why_not),
    }
}

/// The executor's watch budget for a claim (docs/design.md §4): `claim_timeout − max(10 %, 60 s)`.
/// Zero when the timeout is shorter than the hold-back.
pub fn watch_budget(claim_timeout_seconds: u32) -> Duration {
    let hold_back = (u64::from(claim_timeout_seconds) / 10).max(60);
    Duration::from_secs(u64::from(claim_timeout_seconds).saturating_sub(hold_back))
}

/// Smallest watch budget an order that needs watching may have (docs/design.md §4).
pub const MIN_WATCH_BUDGET: Duration = Duration::from_secs(60);

/// Seconds without contact after which an agent is `stale`: 3 × its lease, or 5 minutes for an
/// agent that claims without a lease (docs/design.md §5).
pub fn stale_after_seconds(lease_seconds: Option<i32>) -> i64 {
    match lease_seconds {
        Some(lease) if lease > 0 => 3 * i64::from(lease),
        _ => 300,
    }
}

/// Derived health (docs/design.md §5): `retired`, `never_seen`, `stale` or `active`.
pub fn agent_health(
    retired: bool,
    last_seen_at: Option<DateTime<Utc>>,
    lease_seconds: Option<i32>,
    now: DateTime<Utc>,
) -> AgentHealth {
    if retired {
        return AgentHealth::Retired;
    }
    match last_seen_at {
        None => AgentHealth::NeverSeen,
        Some(seen) if (now - seen).num_seconds() > stale_after_seconds(lease_seconds) => {
            AgentHealth::Stale
        }
        Some(_) => AgentHealth::Active,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_from_the_base() {
        assert_eq!(retry_delay_seconds(10, 1), 10);
        assert_eq!(retry_delay_seconds(10, 2), 20);
        assert_eq!(retry_delay_seconds(10, 3), 40);
        assert_eq!(retry_delay_seconds(60, 11), 61_440);
    }

    #[test]
    fn retry_delay_is_capped_and_never_overflows() {
        assert_eq!(retry_delay_seconds(86_400, 100), MAX_BACKOFF_SECONDS);
        assert_eq!(retry_delay_seconds(1, 64), MAX_BACKOFF_SECONDS);
        assert_eq!(retry_delay_seconds(u32::MAX, u32::MAX), MAX_BACKOFF_SECONDS);
        assert_eq!(retry_delay_seconds(10, 0), 10);
    }

    #[test]
    fn max_retries_zero_means_one_attempt() {
        assert_eq!(decide_failure(0, 0, 10, true), FailureDecision::Fail);
        assert_eq!(
            decide_failure(0, 1, 10, true),
            FailureDecision::Retry {
                retry_count: 1,
                delay_seconds: 10
            }
        );
        assert_eq!(decide_failure(1, 1, 10, true), FailureDecision::Fail);
        assert_eq!(
            decide_failure(2, 3, 10, true),
            FailureDecision::Retry {
                retry_count: 3,
                delay_seconds: 40
            }
        );
        assert_eq!(decide_failure(3, 3, 10, true), FailureDecision::Fail);
        assert_eq!(decide_failure(0, 3, 10, false), FailureDecision::Fail);
    }

    #[test]
    fn a_disruption_runs_again_only_when_safe_stopped_and_reclaims_are_left() {
        use RetryOnDisruption::{Never, Safe};
        assert_eq!(
            decide_disruption(Never, true, 0, 5),
            DisruptionDecision::Fail { why_not: None }
        );
        assert_eq!(
            decide_disruption(Safe, true, 0, 5),
            DisruptionDecision::RunAgain
        );
        assert_eq!(
            decide_disruption(Safe, true, 4, 5),
            DisruptionDecision::RunAgain
        );
        assert_eq!(
            decide_disruption(Safe, true, 5, 5),
            DisruptionDecision::Fail {
                why_not: Some("; not run again: 5 reclaims used (max_reclaims 5)".into())
            }
        );
        assert_eq!(
            decide_disruption(Safe, true, 1, 1),
            DisruptionDecision::Fail {
                why_not: Some("; not run again: 1 reclaim used (max_reclaims 1)".into())
            }
        );
        // max_reclaims 0: a disruption is never run again.
        assert!(matches!(
            decide_disruption(Safe, true, 0, 0),
            DisruptionDecision::Fail { why_not: Some(_) }
        ));
        // A run that may still go on is never doubled, reclaims left or not.
        for reclaims in [0, 5] {
            assert_eq!(
                decide_disruption(Safe, false, reclaims, 5),
                DisruptionDecision::Fail {
                    why_not: Some("; not run again: the disrupted run may still be running".into())
                }
            );
        }
    }

    #[test]
    fn watch_budget_holds_back_ten_percent_or_a_minute() {
        assert_eq!(watch_budget(3600), Duration::from_secs(3240));
        assert_eq!(watch_budget(600), Duration::from_secs(540));
        assert_eq!(watch_budget(119), Duration::from_secs(59));
        assert_eq!(watch_budget(120), Duration::from_secs(60));
        assert_eq!(watch_budget(30), Duration::ZERO);
    }

    #[test]
    fn health_is_derived_from_contact() {
        let now = Utc::now();
        assert_eq!(agent_health(false, None, None, now), AgentHealth::NeverSeen);
        assert_eq!(
            agent_health(true, Some(now), None, now),
            AgentHealth::Retired
        );
        let ago = |s| Some(now - chrono::Duration::seconds(s));
        assert_eq!(
            agent_health(false, ago(299), None, now),
            AgentHealth::Active
        );
        assert_eq!(agent_health(false, ago(301), None, now), AgentHealth::Stale);
        assert_eq!(
            agent_health(false, ago(31), Some(10), now),
            AgentHealth::Stale
        );
        assert_eq!(
            agent_health(false, ago(29), Some(10), now),
            AgentHealth::Active
        );
    }
}

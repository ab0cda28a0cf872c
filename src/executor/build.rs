//! A `build` order (docs/design.md §4): the executor applies its one Shipwright `Build`, waits
//! until Shipwright has registered it, creates the attempt's `BuildRun` by server-side apply and
//! watches it until it ends or the build window closes. Checked against Tekton v1.15 and
//! Shipwright v0.20 running for real on the test node (`e2e/shipwright`, issue #38).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::apply::{Applied, Applier};
use super::pods;
use super::verdict::{
    ObjectVerdict, api_message, build_registered, buildrun_verdict, is_transient, terminal,
};
use super::watch::{WatchEnd, Watches};
use crate::manifest;
use crate::pull::Verdict;
use crate::wire::WorkOrder;

/// Longest a BuildRun is watched, whatever the budget (docs/design.md §4).
pub const BUILD_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Longest the executor waits for Shipwright to register a Build before it creates its BuildRun.
/// Shipwright registers a Build in well under a second; one still unregistered after this long
/// has no Shipwright build controller behind it (a retryable failure).
pub const REGISTER_WAIT: Duration = Duration::from_secs(60);

/// How often the Build is read while it waits to be registered (one GET each).
const REGISTER_POLL: Duration = Duration::from_millis(250);

/// A `build` order's BuildRun, watched until `window_end`.
#[derive(Debug)]
pub struct BuildPlan {
    /// The attempt's BuildRun, as created.
    pub run: Applied,
    window_end: Instant,
    window: Duration,
}

impl BuildPlan {
    /// Applies the order's one Build, waits until Shipwright has registered it, and creates the
    /// attempt's BuildRun. `Err` is the order's verdict: not exactly one Build (terminal), no
    /// registration within min([`REGISTER_WAIT`], the budget left) (retryable), a Build that
    /// cannot be read (terminal) or an API error (as [`Applier::apply`] classifies it).
    ///
    /// Why wait: Shipwright's BuildRun controller reads the Build from its informer cache, and a
    /// BuildRun created right after its Build failed for good with `BuildNotFound` when that cache
    /// had not seen the Build yet (1 of 3 trivial builds on the real node, Shipwright v0.20).
    /// Once Shipwright's Build controller has written `status.registered`, True or False, the
    /// shared cache has the Build. Whether the Build is valid is left to Shipwright's BuildRun
    /// controller, which reads the same `registered` and fails the BuildRun with
    /// `BuildRegistrationFailed` and the Build's reason when it is not True: Build statuses have
    /// no `observedGeneration`, so a `registered` read here may be the one of an earlier spec of
    /// the same Build, and only Shipwright can tell (docs/design.md §4).
    pub async fn apply(
        applier: &Applier,
        order: &WorkOrder,
        docs: Vec<Value>,
        deadline: Instant,
        budget: Duration,
        stop: &CancellationToken,
    ) -> Result<BuildPlan, Verdict> {
        let Some(build) = docs
            .first()
            .filter(|d| docs.len() == 1 && manifest::is_shipwright_build(d))
        else {
            return Err(terminal(
                "a build work order holds exactly one Build (apiVersion shipwright.io/v1beta1)",
            ));
        };
        let id = order.id.to_string();
        let build = applier.apply(build, &id).await?;
        registered(
            applier,
            &build,
            deadline.min(Instant::now() + REGISTER_WAIT),
            stop,
        )
        .await?;
        // Named by order and attempt: a reclaimed delivery re-attaches to its BuildRun, a retry
        // after a failure starts a new one.
        let run_name = buildrun_name(&build.name, order);
        let run = json!({
            "apiVersion": "shipwright.io/v1beta1",
            "kind": "BuildRun",
            "metadata": {"name": run_name, "namespace": build.namespace},
            "spec": {"build": {"name": build.name}},
        });
        let run = applier.apply(&run, &id).await?;
        let window = BUILD_WINDOW.min(budget);
        Ok(BuildPlan {
            run,
            window_end: deadline.min(Instant::now() + window),
            window,
        })
    }

    /// Waits on the shared BuildRun watch for the verdict: success with the image digest, a
    /// failure with Shipwright's reason and message and how the failed step ended.
    pub async fn watch(self, watches: &Watches, stop: &CancellationToken) -> Verdict {
        let run = &self.run;
        match watches
            .wait_for(run, self.window_end, stop, buildrun_verdict)
            .await
        {
            WatchEnd::Verdict(ObjectVerdict::Succeeded(digest)) => {
                Verdict::Success { message: digest }
            }
            WatchEnd::Verdict(ObjectVerdict::Failed { reason, message }) => {
                let mut text = format!("{} failed: {reason}: {message}", run.display());
                if let Some(step) = pods::failed_build_step(watches.client(), run).await {
                    text.push_str(&format!(": {step}"));
                }
                Verdict::Failure {
                    message: text,
                    retryable: true,
                }
            }
            WatchEnd::Verdict(ObjectVerdict::Pending) => {
                unreachable!("wait_for ends only on terminal verdicts")
            }
            WatchEnd::Deleted => {
                terminal(format!("{} was deleted before it finished", run.display()))
            }
            WatchEnd::DeadlineReached => terminal(format!(
                "{} still running after the build window of {} s; the BuildRun is left alone",
                run.display(),
                self.window.as_secs()
            )),
            WatchEnd::Stopped => terminal("stopped"),
        }
    }
}

/// Reads `build` every [`REGISTER_POLL`] until Shipwright has written its `status.registered`
/// (Ok), or `until` passes (a retryable failure naming the seconds waited). A Build gone is a
/// terminal failure, and so is a read refused for good (a 403 says the executor's Role needs
/// `get` on builds, which it did not before this wait).
async fn registered(
    applier: &Applier,
    build: &Applied,
    until: Instant,
    stop: &CancellationToken,
) -> Result<(), Verdict> {
    let api = build.api(applier.client());
    let started = Instant::now();
    loop {
        match api.get_opt(&build.name).await {
            Ok(Some(object)) if build_registered(&object.data) => return Ok(()),
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(terminal(format!(
                    "{} was deleted before its BuildRun was created",
                    build.display()
                )));
            }
            Err(error) if !is_transient(&error) => {
                let hint = match &error {
                    kube::Error::Api(status) if status.code == 403 => {
                        " (the executor's Role needs `get` on builds.shipwright.io)"
                    }
                    _ => "",
                };
                return Err(terminal(format!(
                    "cannot read {} to see whether Shipwright registered it{hint}: {}",
                    build.display(),
                    api_message(&error)
                )));
            }
            Err(error) => tracing::debug!(%error, build = %build.display(), "reading the Build"),
        }
        if Instant::now() + REGISTER_POLL > until {
            return Err(Verdict::Failure {
                message: format!(
                    "{} not registered by Shipwright within {} s: is Shipwright's build controller running?",
                    build.display(),
                    started.elapsed().as_secs()
                ),
                retryable: true,
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(REGISTER_POLL) => {}
            _ = stop.cancelled() => return Err(terminal("stopped")),
        }
    }
}

/// `<build>-<first 8 hex of the order id>-<attempt>`, at most 63 characters.
pub fn buildrun_name(build: &str, order: &WorkOrder) -> String {
    let suffix = format!(
        "-{}-{}",
        &order.id.simple().to_string()[..8],
        order.retry_count
    );
    let keep = 63usize.saturating_sub(suffix.len());
    let prefix: String = build.chars().take(keep).collect();
    format!("{}{suffix}", prefix.trim_end_matches('-'))
}

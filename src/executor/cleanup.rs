//! Deleting what a cancelled order created (docs/design.md §4): its Jobs and BuildRuns, found by the
//! `pullman.dev/work-order` label, with background propagation so their pods go too.

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, PropagationPolicy};

use super::apply::{Applier, WORK_ORDER_LABEL};
use crate::manifest;
use crate::wire::WorkOrder;

/// Deletes the Jobs and BuildRuns `order` created, in every namespace its documents name.
pub async fn delete_created(applier: &Applier, order: &WorkOrder) {
    let selector = format!("{WORK_ORDER_LABEL}={}", order.id);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    let docs =
        manifest::parse_documents(order.yaml_content.as_deref().unwrap_or("")).unwrap_or_default();
    let mut targets = Vec::new();
    for doc in &docs {
        if (manifest::is_job(doc) || manifest::is_shipwright_build(doc))
            && let Ok(t) = applier.locate(doc).await
        {
            targets.push((t.namespace.clone(), manifest::is_job(doc)));
        }
    }
    for (namespace, is_job) in targets {
        let ns = namespace.unwrap_or_else(|| applier.target_namespace().to_string());
        let gvk = if is_job {
            GroupVersionKind::gvk("batch", "v1", "Job")
        } else {
            GroupVersionKind::gvk("shipwright.io", "v1beta1", "BuildRun")
        };
        let Ok((resource, _)) = applier.resolve(&gvk).await else {
            continue;
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(applier.client().clone(), &ns, &resource);
        match api
            .delete_collection(&dp, &ListParams::default().labels(&selector))
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = %ns, kind = %gvk.kind, "deleted what the cancelled order created")
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not delete what the cancelled order created")
            }
        }
    }
}

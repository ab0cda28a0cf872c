//! Server-side apply of a work order's objects (docs/design.md §4): discovery maps each
//! `apiVersion`/`kind` to its resource and scope (cached; refreshed when a kind is unknown),
//! namespaced objects without a namespace go to the target namespace, every object is labelled
//! with its work order, and Namespaces and CRDs go first (a CRD is waited on until Established).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client};
use serde_json::Value;

use super::verdict::{api_message, is_transient};
use crate::manifest;

/// Field manager of everything the executor applies (docs/design.md §4); the controller has its own
/// (`controller::FIELD_MANAGER`, `pullman-controller`).
pub const EXECUTOR_FIELD_MANAGER: &str = "pullman-executor";
/// Label every applied object carries: the work order id.
pub const WORK_ORDER_LABEL: &str = "pullman.dev/work-order";

/// Why applying failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyError {
    pub message: String,
    pub retryable: bool,
}

/// An applied object, for result messages and watching.
#[derive(Debug, Clone)]
pub struct Applied {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub resource: ApiResource,
}

impl Applied {
    /// `Kind namespace/name` or `Kind name`.
    pub fn display(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }

    /// A dynamic API for this object's resource and namespace.
    pub fn api(&self, client: &Client) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.resource),
            None => Api::all_with(client.clone(), &self.resource),
        }
    }
}

/// Applies objects with a cached discovery.
pub struct Applier {
    client: Client,
    target_namespace: String,
    cache: Mutex<HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>>,
}

fn gvk_of(doc: &Value) -> GroupVersionKind {
    let api_version = manifest::api_version(doc);
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, manifest::kind(doc))
}

/// Apply order: Namespaces, then CRDs, then everything else, each group in document order.
pub fn apply_rank(doc: &Value) -> u8 {
    match (manifest::api_version(doc), manifest::kind(doc)) {
        ("v1", "Namespace") => 0,
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => 1,
        _ => 2,
    }
}

impl Applier {
    /// An applier that defaults namespaced objects to `target_namespace`.
    pub fn new(client: Client, target_namespace: String) -> Self {
        Applier {
            client,
            target_namespace,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn target_namespace(&self) -> &str {
        &self.target_namespace
    }

    /// Resolves a kind through the cache, asking the API server when it is not cached (a CRD
    /// applied a moment ago, or one installed since the last lookup).
    pub async fn resolve(
        &self,
        gvk: &GroupVersionKind,
    ) -> Result<(ApiResource, ApiCapabilities), ApplyError> {
        if let Some(hit) = self.cache.lock().unwrap().get(gvk) {
            return Ok(hit.clone());
        }
        match kube::discovery::pinned_kind(&self.client, gvk).await {
            Ok(found) => {
                self.cache
                    .lock()
                    .unwrap()
                    .insert(gvk.clone(), found.clone());
                Ok(found)
            }
            Err(e) if is_transient(&e) => Err(ApplyError {
                message: format!(
                    "discovery of {}/{} {} failed: {}",
                    gvk.group,
                    gvk.version,
                    gvk.kind,
                    api_message(&e)
                ),
                retryable: true,
            }),
            Err(e) => Err(ApplyError {
                message: format!(
                    "the cluster does not serve kind {} in {}{}",
                    gvk.kind,
                    if gvk.group.is_empty() {
                        gvk.version.clone()
                    } else {
                        format!("{}/{}", gvk.group, gvk.version)
                    },
                    match &e {
                        // kube's discovery errors carry Rust debug text of the kind; the
                        // sentence above already says everything they do.
                        kube::Error::Discovery(_) => String::new(),
                        other => format!(": {}", api_message(other)),
                    }
                ),
                retryable: false,
            }),
        }
    }

    /// Where a document goes: its resource and namespace (defaulted for namespaced kinds, never
    /// set for cluster-scoped ones).
    pub async fn locate(&self, doc: &Value) -> Result<Applied, ApplyError> {
        let gvk = gvk_of(doc);
        let (resource, caps) = self.resolve(&gvk).await?;
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let namespace = match caps.scope {
            Scope::Cluster => None,
            Scope::Namespaced => Some(
                doc.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|ns| !ns.is_empty())
                    .unwrap_or(&self.target_namespace)
                    .to_string(),
            ),
        };
        Ok(Applied {
            kind: gvk.kind,
            namespace,
            name,
            resource,
        })
    }

    /// Applies one document with server-side apply (force), labelled with the work order.
    pub async fn apply(&self, doc: &Value, work_order: &str) -> Result<Applied, ApplyError> {
        let target = self.locate(doc).await?;
        if target.name.is_empty() {
            return Err(ApplyError {
                message: format!(
                    "{} has no metadata.name; server-side apply needs one",
                    target.kind
                ),
                retryable: false,
            });
        }
        let mut obj = doc.clone();
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .expect("parse_documents checked metadata is a mapping");
        match &target.namespace {
            Some(ns) => {
                meta.insert("namespace".into(), Value::String(ns.clone()));
            }
            None => {
                meta.remove("namespace");
            }
        }
        let labels = meta
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if !labels.is_object() {
            *labels = Value::Object(Default::default());
        }
        labels.as_object_mut().expect("just made an object").insert(
            WORK_ORDER_LABEL.into(),
            Value::String(work_order.to_string()),
        );
        let params = PatchParams::apply(EXECUTOR_FIELD_MANAGER).force();
        target
            .api(&self.client)
            .patch(&target.name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|e| ApplyError {
                message: format!("applying {}: {}", target.display(), api_message(&e)),
                retryable: is_transient(&e),
            })?;
        Ok(target)
    }

    /// Waits until the CRD `name` is Established (it serves its kinds), then forgets cached
    /// discovery so its kinds resolve.
    pub async fn wait_established(&self, name: &str, deadline: Instant) -> Result<(), ApplyError> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        loop {
            let established = api.get_opt(name).await.ok().flatten().is_some_and(|crd| {
                crd.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                self.cache.lock().unwrap().clear();
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ApplyError {
                    message: format!("CustomResourceDefinition {name} was not Established in time"),
                    retryable: true,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

//! Multi-document YAML as carried in `yaml_content` (DESIGN.md §4, §5): parsed once at creation to
//! reject what can never apply, and again by the executor to apply it.

use serde::Deserialize;
use serde_json::Value;

/// A problem with `yaml_content`, phrased for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

/// Parses every YAML document in `yaml`, dropping empty ones (a document that is only comments is
/// empty). Each remaining document must be a mapping with string `apiVersion` and `kind` and a
/// `metadata` mapping. Documents are returned as JSON values in their original order.
///
/// Errors name the document (1-based) and what is wrong with it.
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>, ManifestError> {
    let mut docs = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(yaml).enumerate() {
        let n = index + 1;
        let value = serde_norway::Value::deserialize(document)
            .map_err(|e| ManifestError(format!("yaml_content document {n} does not parse: {e}")))?;
        if value.is_null() {
            continue;
        }
        let json = serde_json::to_value(&value).map_err(|e| {
            ManifestError(format!(
                "yaml_content document {n} cannot be represented as JSON: {e}"
            ))
        })?;
        check_object(n, &json)?;
        docs.push(json);
    }
    Ok(docs)
}

fn check_object(n: usize, doc: &Value) -> Result<(), ManifestError> {
    let Some(map) = doc.as_object() else {
        return Err(ManifestError(format!(
            "yaml_content document {n} is not a mapping (a Kubernetes object)"
        )));
    };
    for key in ["apiVersion", "kind"] {
        match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => {
                return Err(ManifestError(format!(
                    "yaml_content document {n}: {key} must be a non-empty string"
                )));
            }
            None => {
                return Err(ManifestError(format!(
                    "yaml_content document {n} has no {key}"
                )));
            }
        }
    }
    match map.get("metadata") {
        Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(ManifestError(format!(
            "yaml_content document {n}: metadata must be a mapping"
        ))),
        None => Err(ManifestError(format!(
            "yaml_content document {n} has no metadata"
        ))),
    }
}

/// `apiVersion` of a parsed document (present after [`parse_documents`]).
pub fn api_version(doc: &Value) -> &str {
    doc.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// `kind` of a parsed document (present after [`parse_documents`]).
pub fn kind(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// True for a `batch/v1` Job: the executor watches these to a verdict.
pub fn is_job(doc: &Value) -> bool {
    api_version(doc) == "batch/v1" && kind(doc) == "Job"
}

/// True for a Shipwright `Build` of the version Pullman speaks (DESIGN.md §4).
pub fn is_shipwright_build(doc: &Value) -> bool {
    api_version(doc) == "shipwright.io/v1beta1" && kind(doc) == "Build"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_comment_only_documents_are_dropped() {
        let yaml = "---\n# only a comment\n---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n";
        let docs = parse_documents(yaml).unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(kind(&docs[0]), "ConfigMap");
    }

    #[test]
    fn each_document_needs_api_version_kind_and_metadata() {
        let err = parse_documents("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert_eq!(err.0, "yaml_content document 1 has no metadata");
        let err = parse_documents("kind: A\nmetadata: {}\n---\napiVersion: v1\n").unwrap_err();
        assert_eq!(err.0, "yaml_content document 1 has no apiVersion");
        let err = parse_documents("- a\n- b\n").unwrap_err();
        assert!(err.0.contains("not a mapping"), "{err}");
    }

    #[test]
    fn unparsable_yaml_names_the_document() {
        let err = parse_documents("apiVersion: v1\nkind: A\nmetadata: {}\n---\nfoo: [unclosed\n")
            .unwrap_err();
        assert!(
            err.0.starts_with("yaml_content document 2 does not parse"),
            "{err}"
        );
    }
}
